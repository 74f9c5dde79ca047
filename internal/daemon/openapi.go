package daemon

import (
	_ "embed"
	"net/http"
)

// openAPIDocument is the OpenAPI 3 description of the API, served at
// GET /openapi.json; TestOpenAPIDescribesTheAPI keeps it true to the
// handlers.
//
//go:embed openapi.json
var openAPIDocument []byte

// OpenAPI returns the OpenAPI 3 document of the API.
func OpenAPI() []byte { return openAPIDocument }

func serveOpenAPI(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Write(openAPIDocument)
}
