// Package upload is the vocabulary of an upload: the intent and what a
// close asks of the store (NewIntent, Stage, FinalizeRequest,
// Verification, Outcome), Finalize's refusals, and the upload's state
// machine (Transition, StateOf), pure and table-tested like
// placement.Transition. It does no I/O: the store records these types in
// Postgres, the handlers drive them over HTTP (docs/uploads.md).
package upload
