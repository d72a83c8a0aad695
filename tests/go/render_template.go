// Renders an Ollama Modelfile TEMPLATE the way Ollama does (Go text/template with Ollama's
// `json` function), for tests/test_ollama.py: template file in argv[1], data as JSON on stdin.
package main

import (
	"encoding/json"
	"os"
	"text/template"
)

func main() {
	text, err := os.ReadFile(os.Args[1])
	if err != nil {
		panic(err)
	}
	funcs := template.FuncMap{"json": func(v any) string { b, _ := json.Marshal(v); return string(b) }}
	tmpl := template.Must(template.New("t").Option("missingkey=error").Funcs(funcs).Parse(string(text)))
	var data map[string]any
	if err := json.NewDecoder(os.Stdin).Decode(&data); err != nil {
		panic(err)
	}
	if err := tmpl.Execute(os.Stdout, data); err != nil {
		panic(err)
	}
}
