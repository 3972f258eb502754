// Package soak holds Blobplane's crash soak (issue 27, "Acknowledged means
// kept"): real api and worker processes for two datacenters on a private
// Postgres cluster take concurrent uploads while the test kills them with
// SIGKILL, restarts them with the same node ids, and crash-restarts
// Postgres; at the end every upload that was answered 201 or 202 must read
// back with its exact bytes. The package has no code of its own: the soak
// is soak_test.go, its helpers the other _test.go files. `make test` runs
// it; `go test -short` skips it. See docs/uploads.md, "Acknowledged means
// kept".
package soak
