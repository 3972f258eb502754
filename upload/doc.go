// Package upload owns an upload from its first byte to its publication:
// the vocabulary (Intent, NewIntent, Stage, FinalizeRequest,
// Verification, Outcome, Finalize's refusals), the state machine
// (Transition, StateOf; pure and table-tested like placement.Transition)
// and the flow that follows it (Flow: open, append, close, verify,
// publish at the home, forward, accept). The flow reaches Postgres, the
// lease keeper and other nodes only through the interfaces of ports.go,
// which store.Store, the keeper and jobs implement; the handlers
// translate HTTP into its calls and its answers (Result, Error) into
// responses (docs/uploads.md).
package upload
