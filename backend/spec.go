package backend

import (
	"context"
	"fmt"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/blobplane/blobplane"
)

// StorePolicy says which representation a backend stores.
type StorePolicy string

// Store policies, set with ?store= in a backend spec.
const (
	// StoreAsSubmitted keeps what the writer sent: identity stays
	// identity, a zstd payload stays zstd. The default.
	StoreAsSubmitted StorePolicy = "as-submitted"
	// StoreZstd compresses identity bodies while they stream; zstd
	// payloads are kept.
	StoreZstd StorePolicy = "zstd"
	// StoreIdentity decodes zstd payloads while they stream.
	StoreIdentity StorePolicy = "identity"
)

// SyncMode says how a filesystem backend makes a new object durable, set
// with ?sync= in its spec (docs/backends.md).
type SyncMode string

// Sync modes. The zero value picks SyncFilesystem where the kernel reports
// its errors (Linux 5.8 and later) and SyncFile elsewhere.
const (
	// SyncFile fsyncs each object's file and its directory.
	SyncFile SyncMode = "file"
	// SyncFilesystem makes the objects of concurrent writes durable
	// together with one syncfs(2) of the backend's filesystem.
	SyncFilesystem SyncMode = "filesystem"
)

// Backend kinds.
const (
	KindFilesystem = "filesystem"
	KindS3         = "s3"
)

// Spec is one parsed, validated backend entry of BLOBPLANE_BACKENDS.
type Spec struct {
	Name  string
	Kind  string // KindFilesystem or KindS3
	Store StorePolicy
	// Path is the filesystem root (KindFilesystem).
	Path string
	// Sync is how a filesystem backend makes objects durable; "" picks
	// (KindFilesystem).
	Sync SyncMode
	// Direct, when > 0, is the smallest content size a filesystem backend
	// writes past the page cache (O_DIRECT); 0 never (KindFilesystem).
	Direct int64
	// S3 is the bucket configuration (KindS3).
	S3 S3Config
}

// S3Config is the configuration of an S3 backend.
type S3Config struct {
	Bucket string
	// Prefix is prepended to every key ("" or ending in "/").
	Prefix string
	// Endpoint overrides the AWS endpoint (MinIO, other S3-compatibles).
	Endpoint  string
	Region    string
	PathStyle bool
	// AccessKeyID and SecretAccessKey are static credentials; when empty
	// the standard AWS chain (environment, shared config, IMDS, ...) is used.
	AccessKeyID     string
	SecretAccessKey string
	// PartSize is the multipart part size and the single-PUT threshold
	// (0: the backend's default).
	PartSize int64
}

// String renders the spec back in configuration syntax, with any secret
// redacted, for logs and error messages.
func (s Spec) String() string {
	q := url.Values{}
	if s.Store != "" && s.Store != StoreAsSubmitted {
		q.Set("store", string(s.Store))
	}
	switch s.Kind {
	case KindFilesystem:
		if s.Sync != "" {
			q.Set("sync", string(s.Sync))
		}
		if s.Direct > 0 {
			q.Set("direct", strconv.FormatInt(s.Direct, 10))
		}
		if len(q) > 0 {
			return fmt.Sprintf("%s=filesystem:%s?%s", s.Name, s.Path, q.Encode())
		}
		return fmt.Sprintf("%s=filesystem:%s", s.Name, s.Path)
	case KindS3:
		c := s.S3
		if c.Endpoint != "" {
			q.Set("endpoint", c.Endpoint)
		}
		if c.Region != "" {
			q.Set("region", c.Region)
		}
		if c.PathStyle {
			q.Set("path_style", "true")
		}
		if c.AccessKeyID != "" {
			q.Set("access_key_id", c.AccessKeyID)
			q.Set("secret_access_key", "REDACTED")
		}
		if c.PartSize > 0 {
			q.Set("part_size", strconv.FormatInt(c.PartSize, 10))
		}
		u := url.URL{Scheme: "s3", Host: c.Bucket, Path: "/" + strings.TrimSuffix(c.Prefix, "/"), RawQuery: q.Encode()}
		if c.Prefix == "" {
			u.Path = ""
		}
		return s.Name + "=" + u.String()
	}
	return s.Name + "=?"
}

// ParseSpecs parses a comma-separated list of named backends:
//
//	name=filesystem:<path>[?store=as-submitted|zstd|identity][&sync=file|filesystem][&direct=<bytes>]
//	name=s3://<bucket>[/<prefix>]?endpoint=<url>&region=<r>&path_style=true
//	       [&access_key_id=<id>&secret_access_key=<secret>][&part_size=<bytes>][&store=...]
//
// for example "fs=filesystem:./.data/local/blobs" or
// "s3main=s3://bucket?endpoint=http://127.0.0.1:9000&path_style=true&region=us-east-1".
// Names are lowercase letters, digits, '-' and '_', start with a letter and
// are unique. A filesystem path may not contain ',' or '?'. Every error names
// the offending entry.
func ParseSpecs(s string) ([]Spec, error) {
	if strings.TrimSpace(s) == "" {
		return nil, blobplane.Errorf(blobplane.CodeInvalid, "backends: empty list (want name=filesystem:<path> or name=s3://<bucket>?..., comma-separated)")
	}
	var specs []Spec
	seen := map[string]bool{}
	for i, entry := range strings.Split(s, ",") {
		entry = strings.TrimSpace(entry)
		spec, err := ParseSpec(entry)
		if err != nil {
			return nil, blobplane.Wrap(blobplane.CodeInvalid, err, "backends: entry %d (%q): %s", i+1, redact(entry), blobplane.ErrorMessage(err))
		}
		if seen[spec.Name] {
			return nil, blobplane.Errorf(blobplane.CodeInvalid, "backends: entry %d (%q): name %q is used twice", i+1, redact(entry), spec.Name)
		}
		seen[spec.Name] = true
		specs = append(specs, spec)
	}
	return specs, nil
}

// ParseSpec parses one name=... entry; see ParseSpecs.
func ParseSpec(entry string) (Spec, error) {
	name, rest, ok := strings.Cut(entry, "=")
	if !ok || rest == "" {
		return Spec{}, blobplane.Errorf(blobplane.CodeInvalid, "want name=filesystem:<path> or name=s3://<bucket>?...")
	}
	if !validName(name) {
		return Spec{}, blobplane.Errorf(blobplane.CodeInvalid, "name %q: want a lowercase letter followed by letters, digits, '-' or '_'", name)
	}
	spec := Spec{Name: name, Store: StoreAsSubmitted}
	var err error
	switch {
	case strings.HasPrefix(rest, "filesystem:"):
		err = spec.parseFilesystem(strings.TrimPrefix(rest, "filesystem:"))
	case strings.HasPrefix(rest, "s3://"):
		err = spec.parseS3(rest)
	default:
		kind, _, _ := strings.Cut(rest, ":")
		return Spec{}, blobplane.Errorf(blobplane.CodeInvalid, "unknown backend kind %q: want filesystem:<path> or s3://<bucket>", truncate(kind))
	}
	if err != nil {
		return Spec{}, err
	}
	return spec, nil
}

// parseFilesystem fills s from what follows "filesystem:": a path and its
// options.
func (s *Spec) parseFilesystem(rest string) error {
	s.Kind = KindFilesystem
	path, query, _ := strings.Cut(rest, "?")
	if path == "" {
		return blobplane.Errorf(blobplane.CodeInvalid, "filesystem: empty path")
	}
	s.Path = path
	q, err := url.ParseQuery(query)
	if err != nil {
		return blobplane.Errorf(blobplane.CodeInvalid, "filesystem: bad options %q", query)
	}
	if err := s.takeStore(q); err != nil {
		return err
	}
	if err := s.takeSync(q); err != nil {
		return err
	}
	if err := s.takeDirect(q); err != nil {
		return err
	}
	return noneLeft("filesystem", q)
}

func (s *Spec) takeSync(q url.Values) error {
	switch m := SyncMode(take(q, "sync")); m {
	case "", SyncFile, SyncFilesystem:
		s.Sync = m
	default:
		return blobplane.Errorf(blobplane.CodeInvalid, "filesystem: sync %q: want file or filesystem", truncate(string(m)))
	}
	return nil
}

func (s *Spec) takeDirect(q url.Values) error {
	d := take(q, "direct")
	if d == "" {
		return nil
	}
	n, err := strconv.ParseInt(d, 10, 64)
	if err != nil || n < 1 {
		return blobplane.Errorf(blobplane.CodeInvalid, "filesystem: direct %q: want the smallest size in bytes (≥ 1) written past the page cache", truncate(d))
	}
	s.Direct = n
	return nil
}

// parseS3 fills s from an s3://<bucket>[/<prefix>]?... URL.
func (s *Spec) parseS3(rest string) error {
	s.Kind = KindS3
	u, err := url.Parse(rest)
	if err != nil {
		return blobplane.Errorf(blobplane.CodeInvalid, "s3: not a URL")
	}
	c := &s.S3
	c.Bucket = u.Host
	if !validBucket(c.Bucket) {
		return blobplane.Errorf(blobplane.CodeInvalid, "s3: bucket %q: want 3-63 lowercase letters, digits, '.' or '-'", c.Bucket)
	}
	if p := strings.Trim(u.Path, "/"); p != "" {
		c.Prefix = p + "/"
	}
	q := u.Query()
	if err := s.takeStore(q); err != nil {
		return err
	}
	if err := c.takeOptions(q); err != nil {
		return err
	}
	return noneLeft("s3", q)
}

// takeOptions takes the S3 connection options out of q, in the order their
// errors are reported.
func (c *S3Config) takeOptions(q url.Values) error {
	if err := c.takeEndpoint(q); err != nil {
		return err
	}
	c.Region = take(q, "region")
	if err := c.takePathStyle(q); err != nil {
		return err
	}
	c.AccessKeyID = take(q, "access_key_id")
	c.SecretAccessKey = take(q, "secret_access_key")
	if (c.AccessKeyID == "") != (c.SecretAccessKey == "") {
		return blobplane.Errorf(blobplane.CodeInvalid, "s3: access_key_id and secret_access_key go together")
	}
	return c.takePartSize(q)
}

func (c *S3Config) takeEndpoint(q url.Values) error {
	c.Endpoint = take(q, "endpoint")
	if c.Endpoint == "" {
		return nil
	}
	eu, err := url.Parse(c.Endpoint)
	if err != nil || (eu.Scheme != "http" && eu.Scheme != "https") || eu.Host == "" {
		return blobplane.Errorf(blobplane.CodeInvalid, "s3: endpoint %q: want http(s)://host[:port]", c.Endpoint)
	}
	return nil
}

func (c *S3Config) takePathStyle(q url.Values) error {
	ps := take(q, "path_style")
	if ps == "" {
		return nil
	}
	b, err := strconv.ParseBool(ps)
	if err != nil {
		return blobplane.Errorf(blobplane.CodeInvalid, "s3: path_style %q: want true or false", ps)
	}
	c.PathStyle = b
	return nil
}

func (c *S3Config) takePartSize(q url.Values) error {
	ps := take(q, "part_size")
	if ps == "" {
		return nil
	}
	n, err := strconv.ParseInt(ps, 10, 64)
	if err != nil || n < 5<<20 || n > 5<<30 {
		return blobplane.Errorf(blobplane.CodeInvalid, "s3: part_size %q: want bytes between 5 MiB and 5 GiB", ps)
	}
	c.PartSize = n
	return nil
}

func (s *Spec) takeStore(q url.Values) error {
	switch p := StorePolicy(take(q, "store")); p {
	case "":
	case StoreAsSubmitted, StoreZstd, StoreIdentity:
		s.Store = p
	default:
		return blobplane.Errorf(blobplane.CodeInvalid, "store %q: want as-submitted, zstd or identity", truncate(string(p)))
	}
	return nil
}

func take(q url.Values, k string) string {
	v := q.Get(k)
	delete(q, k)
	return v
}

func noneLeft(kind string, q url.Values) error {
	if len(q) == 0 {
		return nil
	}
	keys := make([]string, 0, len(q))
	for k := range q {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return blobplane.Errorf(blobplane.CodeInvalid, "%s: unknown option %q", kind, truncate(keys[0]))
}

func validName(s string) bool {
	if s == "" || len(s) > 64 || s[0] < 'a' || s[0] > 'z' {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

func validBucket(s string) bool {
	if len(s) < 3 || len(s) > 63 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

// redact hides a secret key in an entry quoted back in an error.
func redact(entry string) string {
	i := strings.Index(entry, "secret_access_key=")
	if i < 0 {
		return truncate(entry)
	}
	j := strings.IndexByte(entry[i:], '&')
	rest := ""
	if j >= 0 {
		rest = entry[i+j:]
	}
	return truncate(entry[:i] + "secret_access_key=REDACTED" + rest)
}

// Opener builds a backend of one kind from its spec.
type Opener func(ctx context.Context, spec Spec) (Backend, error)

var (
	openersMu sync.Mutex
	openers   = map[string]Opener{}
)

// Register makes a backend kind available to Open. backend/fs and
// backend/s3 register themselves when imported (the import cycle
// backend → backend/fs → backend rules out a direct call), as database/sql
// drivers do; a binary imports the kinds it supports.
func Register(kind string, open Opener) {
	openersMu.Lock()
	defer openersMu.Unlock()
	if _, dup := openers[kind]; dup {
		panic("backend: Register called twice for kind " + kind)
	}
	openers[kind] = open
}

// Open builds the backend a spec describes.
//
// Errors: ErrInvalid (a kind that is not compiled in, a spec the kind
// rejects), ErrUnavailable or ErrRefused from the backend's own checks.
func Open(ctx context.Context, spec Spec) (Backend, error) {
	openersMu.Lock()
	open := openers[spec.Kind]
	openersMu.Unlock()
	if open == nil {
		return nil, blobplane.Errorf(blobplane.CodeInvalid,
			"backend %s: kind %q is not compiled into this binary (import github.com/blobplane/blobplane/backend/fs or backend/s3)", spec.Name, spec.Kind)
	}
	b, err := open(ctx, spec)
	if err != nil {
		return nil, fmt.Errorf("backend %s: %w", spec.Name, err)
	}
	return b, nil
}
