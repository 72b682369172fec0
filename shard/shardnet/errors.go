package shardnet

import (
	"errors"

	"github.com/elasticps/elasticps/shard"
)

var (
	// ErrInvalidConfig is returned (joined with every problem found) by Validate, NewServer and
	// NewClient.
	ErrInvalidConfig = errors.New("shardnet: invalid config")
	// ErrUnavailable is returned by Client calls that got no answer: the dispatcher could not be
	// reached, the connection failed during the call, no answer came within
	// ClientConfig.CallTimeout, or the server was shutting down. The outcome is unknown, and every
	// shard.Service call is safe to retry; a shard.Reader retries with backoff. The cause is
	// wrapped too.
	ErrUnavailable = errors.New("shardnet: dispatcher unavailable")
	// ErrAuth is returned by Client calls when the dispatcher refused the cluster secret, or could
	// not prove it knows it. It matches shard.ErrPermanent: retrying does not help.
	ErrAuth = errors.New("shardnet: authentication failed")
	// ErrProtocol is returned by Client calls when the peer at the address is not a dispatcher of
	// this protocol version: it does not know the methods, cannot decode the requests, or answers
	// with undecodable responses. It matches shard.ErrPermanent.
	ErrProtocol = errors.New("shardnet: protocol mismatch")
	// ErrClosed is returned by the calls of a closed Client. It matches shard.ErrPermanent.
	ErrClosed = errors.New("shardnet: closed")
)

// permanent marks an error as one retrying cannot cure: it matches shard.ErrPermanent and
// wraps the error.
type permanent struct{ err error }

func (p *permanent) Error() string        { return p.err.Error() }
func (p *permanent) Unwrap() error        { return p.err }
func (p *permanent) Is(target error) bool { return target == shard.ErrPermanent }
