// Package childproc holds what the processes a Blobplane tool starts and
// stops itself (the test MinIO, the bench's servers) are started with.
package childproc
