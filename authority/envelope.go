package authority

import (
	"time"
)

// RouteCode is the "code" of a routing envelope: one of the non-served
// answers of R99–R102 (A.2).
type RouteCode string

// The routing answers a server gives instead of serving.
const (
	RouteMoved     RouteCode = "MOVED"     // R101: my map is newer; here is the assignment and a signed delta
	RouteMisrouted RouteCode = "MISROUTED" // R101, R105: same map (or a different slot): a correctness fault
	RouteStaleMap  RouteCode = "STALE_MAP" // R101: my map is older than yours; retry later
	RouteNotReady  RouteCode = "NOT_READY" // R100: the slot is mine but I cannot serve yet; never a redirect
)

// StatusMoved is the HTTP status of a MOVED answer: 421 Misdirected
// Request, which intermediaries do not follow as they would a 3xx. The
// routing middleware maps the other codes.
const StatusMoved = 421

// Envelope is the routing envelope of the spec's wire format, returned on
// every non-served outcome and readable without knowing the application's
// own error shape. Absent members are JSON null, as in the spec.
type Envelope struct {
	Code         RouteCode   `json:"code"`
	Slot         Slot        `json:"slot"`
	MapVersion   uint64      `json:"map_version"` // the answering server's map version
	RetryAfterMS *int64      `json:"retry_after_ms"`
	Assignment   *Assignment `json:"assignment"` // MOVED (R101); NOT_READY during a handoff: its target (R77)
	MapDelta     *Delta      `json:"map_delta"`  // MOVED only, signed (R103)
}

// Assignment is where the server's map places the slot (MOVED). It is a
// hint for humans and logs; a client routes only by the signed delta
// (R103: unsigned assignments are discarded, never trusted).
type Assignment struct {
	Partition string       `json:"partition"`
	Epoch     uint64       `json:"epoch"`
	Primary   AssignedNode `json:"primary"`
}

// AssignedNode is a node and its endpoint.
type AssignedNode struct {
	Node     string `json:"node"`
	Endpoint string `json:"endpoint"`
}

// RetryAfter returns the envelope's retry delay, or 0.
func (e *Envelope) RetryAfter() time.Duration {
	if e == nil || e.RetryAfterMS == nil || *e.RetryAfterMS < 0 {
		return 0
	}
	return time.Duration(*e.RetryAfterMS) * time.Millisecond
}

func retryMS(d time.Duration) *int64 {
	ms := d.Milliseconds()
	if d > 0 && ms == 0 {
		ms = 1
	}
	return &ms
}

// ParseEnvelope decodes a routing envelope, rejecting unknown members and
// trailing data. A delta inside is not verified here (Client.OnAnswer does).
func ParseEnvelope(data []byte) (*Envelope, error) {
	var e Envelope
	if err := strictDecode(data, &e); err != nil {
		return nil, invalidf("authority.ParseEnvelope", ErrMalformed, "%v", err)
	}
	switch e.Code {
	case RouteMoved, RouteMisrouted, RouteStaleMap, RouteNotReady:
		return &e, nil
	}
	return nil, invalidf("authority.ParseEnvelope", ErrMalformed, "unknown code %q", e.Code)
}
