// Package soak holds Blobplane's fault tests with real processes on a
// private Postgres cluster. The package has no code of its own: the tests
// are its _test.go files. `make test` runs them; `go test -short` skips
// them.
//
//   - The crash soak (issue 27, "Acknowledged means kept", soak_test.go):
//     api and worker processes for two datacenters take concurrent
//     uploads while the test kills them with SIGKILL, restarts them with
//     the same node ids, and crash-restarts Postgres; at the end every
//     upload answered 201 or 202 must read back with its exact bytes
//     (docs/uploads.md).
//   - The replication faults (issue 28, replication_test.go): three
//     datacenters, one on MinIO; a blob reaches all three; a worker
//     SIGKILLed mid-transfer of 512 MiB leaves no half object and its
//     restart completes the copy under a newer epoch; a MinIO outage makes
//     the copy wait (failed/backend_refused, backlog metrics up) and it
//     completes by its own retry once MinIO is back; a datacenter added to
//     a repository's policy gets its copy from the reconciler
//     (docs/replication.md).
package soak
