package ps

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/elasticps/elasticps/embedding"
	"github.com/elasticps/elasticps/internal/rpc"
)

// Protection is what every frame between clients and servers carries after
// the authenticating handshake; see the constants. The zero value,
// ProtectIntegrity, is the default.
type Protection = rpc.Protection

const (
	// ProtectIntegrity authenticates every frame (a 16-byte AES-256-GCM tag
	// over a per-connection counter, the header and the payload, under keys
	// derived from the secret and the handshake's nonces): a frame injected,
	// altered, replayed, reordered or dropped on the path closes the
	// connection. Payloads travel in clear. The default.
	ProtectIntegrity = rpc.ProtectIntegrity
	// ProtectEncrypt also encrypts payloads with AES-256-GCM. A connection is
	// encrypted if either end asks for it.
	ProtectEncrypt = rpc.ProtectEncrypt
	// ProtectNone sends frames without tags, so anyone on the path can
	// inject or alter requests. For measuring the cost of protection only:
	// it takes effect only if both ends ask for it.
	ProtectNone = rpc.ProtectNone
)

// TLS is mutual TLS for a node, the alternative to the secret-based frame protection where
// operators require TLS: Server is what the node serves with (its certificate, and the CAs its
// peers' certificates must chain to), Client what it dials with. The cluster secret is still
// checked inside TLS. LoadTLS reads both from PEM files.
type TLS struct {
	Server, Client *tls.Config
}

// ClientTLS returns t.Client, or nil for a nil t.
func (t *TLS) ClientTLS() *tls.Config {
	if t == nil {
		return nil
	}
	return t.Client
}

// TLSFiles names the PEM files of a node's TLS: its certificate and key, and the CAs.
type TLSFiles = rpc.TLSFiles

// LoadTLS reads a node's certificate, key and CAs: TLS 1.3, certificates required and verified
// both ways.
func LoadTLS(f TLSFiles) (*TLS, error) {
	server, client, err := f.LoadTLS()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadConfig, err)
	}
	return &TLS{Server: server, Client: client}, nil
}

// MinSecretSize is the shortest cluster secret accepted, in bytes; it
// should be that many random bytes.
const MinSecretSize = rpc.MinSecretSize

// Transport opens connections between clients and servers. Real deployments leave it nil for
// TCP; tests pass an in-memory network with fault injection. Listen's listener must return an
// error wrapping net.ErrClosed from Accept once closed; Dial honours ctx during set-up only.
type Transport interface {
	Listen(addr string) (net.Listener, error)
	Dial(ctx context.Context, addr string) (net.Conn, error)
}

// TableSpec names an embedding table a server hosts.
type TableSpec struct {
	Name   string
	Config embedding.Config
	// Dense, when positive, makes the table a dense tensor of Dense floats (an MLP weight
	// matrix, say) rather than an embedding table: it lives whole on the owner of its name's
	// slot, Config.Optimizer applies to it (whatever optimizer InitDense passes), and it holds
	// Initial from the start or, without Initial, zeros until the first InitDense gives its
	// values (later ones change nothing). Declared dense tensors are checkpointed with the
	// tables (Server.CheckpointTables); ones that InitDense creates on the fly are not
	// (elastic's server.Server refuses to snapshot a server hosting one, rather than lose it on
	// a restore).
	Dense int
	// Initial is the initial value of a dense tensor, Dense finite floats: every server holds it
	// from its start (the copy of the owner of the tensor's slot is the tensor), so that no
	// worker has to call InitDense, and InitDense changes nothing. Nil: see Dense. Only for a
	// dense tensor; the server keeps the slice, which must not change afterwards.
	Initial []float32
}

// checkInitial checks the initial value of a dense tensor against its size.
func (t TableSpec) checkInitial() error {
	switch {
	case t.Initial == nil:
		return nil
	case t.Dense <= 0:
		return fmt.Errorf("table %q: Initial is for a dense tensor (Dense > 0)", t.Name)
	case len(t.Initial) != t.Dense:
		return fmt.Errorf("table %q: Initial has %d values, Dense is %d", t.Name, len(t.Initial), t.Dense)
	}
	if i := embedding.FirstNonFinite(t.Initial); i >= 0 {
		return fmt.Errorf("table %q: Initial value %d is %v", t.Name, i, t.Initial[i])
	}
	return nil
}

// ServerConfig configures a Server. ID and Secret are required.
type ServerConfig struct {
	// ID is the server's stable identity in owner tables.
	ID string
	// Secret is the cluster secret every client must prove it knows: at least MinSecretSize
	// (32) random bytes.
	Secret []byte
	// Protection is what every frame carries. Default ProtectIntegrity; ProtectEncrypt here
	// encrypts every connection to this server, at roughly twice the CPU cost of integrity on
	// pulls and pushes.
	Protection Protection
	// Slots is the job's slot count. Default DefaultSlots (4096). It must match the owner tables
	// the server is given.
	Slots int
	// Tables are the embedding tables hosted from the start; CreateTable adds more.
	Tables []TableSpec
	// DeclaredIn, when set, fixes the dense tensors to those declared (Tables, CreateTable):
	// InitDense of another one is refused with ErrUnknownTable, and the refusal says to declare
	// it in DeclaredIn, the field the program lists its tables in ("local.Config.Tables", say).
	// A server whose tables are checkpointed wants it (local.Start sets it): a tensor created on
	// the fly could not be saved, and would fail the next checkpoint instead. Default empty:
	// InitDense creates an undeclared tensor.
	DeclaredIn string
	// SyncWorkers > 0 makes training synchronous: the pushes of a step are held until every one of
	// that many workers has pushed the step, then applied in worker order; a worker's
	// push returns only once its step is applied everywhere it went. Results are then
	// independent of timing. The owner table changes only between steps: a Migrator holds
	// the servers at a step boundary for each handover. Default 0: asynchronous, every push
	// applied on arrival.
	SyncWorkers int
	// MaxConcurrent bounds requests served at once. Default 256.
	MaxConcurrent int
	// Compression offers s2 compression of large responses (used when the client offers it too).
	Compression bool
	// Transport dials the other servers when slots migrate to this one (ReceiveSlots). Nil
	// means TCP.
	Transport Transport
	// TLS, when set, makes every connection to this server mutual TLS, and its calls to other
	// servers (migrations) too. Default nil: the secret-based protocol with Protection.
	TLS *TLS
	// MigrationTTL ends a migration of slots away from this server that nobody has used for
	// this long before its fence (its destination or coordinator died): its change tracking
	// costs every write. Default 1 minute.
	MigrationTTL time.Duration
	// Logger receives refused requests and connection problems. Nil discards. The records do
	// not name the server: where several share a log, give each a logger With its identity
	// (local.Start adds the job, "role" and "node").
	Logger *slog.Logger
}

func (c ServerConfig) serverTLS() *tls.Config {
	if c.TLS == nil {
		return nil
	}
	return c.TLS.Server
}

func (c ServerConfig) clientTLS() *tls.Config {
	if c.TLS == nil {
		return nil
	}
	return c.TLS.Client
}

// DefaultServerConfig returns the configuration of an asynchronous server id with the default
// slot count and no tables yet.
func DefaultServerConfig(id string, secret []byte) ServerConfig {
	return ServerConfig{ID: id, Secret: secret, Slots: DefaultSlots}
}

func (c ServerConfig) withDefaults() ServerConfig {
	if c.Slots == 0 {
		c.Slots = DefaultSlots
	}
	if c.MigrationTTL == 0 {
		c.MigrationTTL = time.Minute
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate reports every problem with c in one error wrapping ErrBadConfig, or nil.
func (c ServerConfig) Validate() error {
	c = c.withDefaults()
	var errs []error
	if c.ID == "" {
		errs = append(errs, errors.New("ID is empty"))
	}
	if err := rpc.ValidateSecret(c.Secret); err != nil {
		errs = append(errs, err)
	}
	if c.Protection > ProtectNone {
		errs = append(errs, fmt.Errorf("Protection %d is unknown", c.Protection))
	}
	if c.Slots < 1 || c.Slots > 1<<20 {
		errs = append(errs, fmt.Errorf("Slots %d not in 1..2^20", c.Slots))
	}
	if c.SyncWorkers < 0 {
		errs = append(errs, fmt.Errorf("SyncWorkers %d is negative", c.SyncWorkers))
	}
	if c.MaxConcurrent < 0 {
		errs = append(errs, fmt.Errorf("MaxConcurrent %d is negative", c.MaxConcurrent))
	}
	if c.MigrationTTL < 0 {
		errs = append(errs, fmt.Errorf("MigrationTTL %v is negative", c.MigrationTTL))
	}
	seen := map[string]bool{}
	for _, t := range c.Tables {
		if err := validTableName(t.Name); err != nil {
			errs = append(errs, err)
		}
		if seen[t.Name] {
			errs = append(errs, fmt.Errorf("table %q listed twice", t.Name))
		}
		seen[t.Name] = true
		ec := t.Config
		switch {
		case t.Dense < 0:
			errs = append(errs, fmt.Errorf("table %q: Dense %d is negative", t.Name, t.Dense))
		case t.Dense > 0:
			dim, _ := denseShape(t.Dense)
			ec = embedding.Config{Dim: dim, Shards: 1, Optimizer: t.Config.Optimizer}
		}
		if err := ec.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("table %q: %w", t.Name, err))
		}
		if err := t.checkInitial(); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrBadConfig, errors.Join(errs...))
}

func validTableName(name string) error {
	if name == "" || len(name) > 200 {
		return fmt.Errorf("table name %q must be 1..200 bytes", name)
	}
	return nil
}

// ClientConfig configures a Client. Secret is required, and either Resolver or Servers.
type ClientConfig struct {
	// Secret is the cluster secret: at least MinSecretSize (32) random bytes.
	Secret []byte
	// Protection is what every frame carries. Default ProtectIntegrity; ProtectEncrypt here
	// encrypts this client's connections.
	Protection Protection
	// Transport dials servers. Nil means TCP.
	Transport Transport
	// Resolver supplies owner tables. Nil means asking the Servers for theirs and taking the
	// newest.
	Resolver Resolver
	// Servers are addresses of servers to ask for the owner table when Resolver is nil.
	Servers []string
	// Parallel bounds the requests one call sends at once. Default 8.
	Parallel int
	// ConnsPerAddr is the number of persistent connections to each server. Default 2.
	ConnsPerAddr int
	// Retries bounds how often one call refreshes a stale owner table and retries. Default 8.
	Retries int
	// RetryBackoff is the first pause before retrying after a server was unreachable (doubling
	// each time). Default 20 ms.
	RetryBackoff time.Duration
	// TLS, when set, is the client side of mutual TLS (TLS.Client); the servers must use TLS.
	TLS *tls.Config
	// FenceWait bounds how long one call waits, in all, for slots fenced by a migration
	// (ErrMoved) and for the owner table that gives them to their new owner. Such waits do not
	// count as retries. Default 10 s.
	FenceWait time.Duration
	// Worker is this client's worker index in synchronous mode (0..SyncWorkers-1).
	Worker int
	// Sync must be set when the servers run synchronously (ServerConfig.SyncWorkers > 0): every
	// push then reaches every server, empty where the worker has no rows for it, so each server's
	// step barrier hears from every worker. A synchronous push is never resent in part (the
	// barrier counts one push per worker and step): when no server counted it and the refusals
	// were for the table it was routed by (the owner table changed between steps), it is resent
	// whole by the newer table; once any server counted it, a refusal fails the call.
	Sync bool
	// Compression offers s2 compression of large requests.
	Compression bool
	// Logger receives retries. Nil discards.
	Logger *slog.Logger
}

// DefaultClientConfig returns the configuration of an asynchronous client that learns the owner
// table from the given servers.
func DefaultClientConfig(secret []byte, servers ...string) ClientConfig {
	return ClientConfig{Secret: secret, Servers: servers}
}

func (c ClientConfig) withDefaults() ClientConfig {
	if c.Parallel == 0 {
		c.Parallel = 8
	}
	if c.ConnsPerAddr == 0 {
		c.ConnsPerAddr = 2
	}
	if c.Retries == 0 {
		c.Retries = 8
	}
	if c.RetryBackoff == 0 {
		c.RetryBackoff = 20 * time.Millisecond
	}
	if c.FenceWait == 0 {
		c.FenceWait = 10 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate reports every problem with c in one error wrapping ErrBadConfig, or nil.
func (c ClientConfig) Validate() error {
	c = c.withDefaults()
	var errs []error
	if err := rpc.ValidateSecret(c.Secret); err != nil {
		errs = append(errs, err)
	}
	if c.Protection > ProtectNone {
		errs = append(errs, fmt.Errorf("Protection %d is unknown", c.Protection))
	}
	if c.Resolver == nil && len(c.Servers) == 0 {
		errs = append(errs, errors.New("neither Resolver nor Servers is set"))
	}
	if c.Parallel < 1 || c.Parallel > 1024 {
		errs = append(errs, fmt.Errorf("Parallel %d not in 1..1024", c.Parallel))
	}
	if c.ConnsPerAddr < 1 || c.ConnsPerAddr > 64 {
		errs = append(errs, fmt.Errorf("ConnsPerAddr %d not in 1..64", c.ConnsPerAddr))
	}
	if c.Retries < 1 {
		errs = append(errs, fmt.Errorf("Retries %d must be positive", c.Retries))
	}
	if c.Worker < 0 {
		errs = append(errs, fmt.Errorf("Worker %d is negative", c.Worker))
	}
	if c.RetryBackoff < 0 {
		errs = append(errs, fmt.Errorf("RetryBackoff %v is negative", c.RetryBackoff))
	}
	if c.FenceWait < 0 {
		errs = append(errs, fmt.Errorf("FenceWait %v is negative", c.FenceWait))
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrBadConfig, errors.Join(errs...))
}
