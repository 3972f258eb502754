package handlers

import _ "embed"

// OpenAPI is the OpenAPI 3.1 document of the /v1 API, served at
// /v1/openapi.json. Every /v1 route of NewRouter is in it and every path
// in it is a route (TestOpenAPIMatchesTheRouter, run in CI).
//
//go:embed openapi.json
var OpenAPI []byte
