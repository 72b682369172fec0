package ps

import (
	"fmt"

	"github.com/elasticps/elasticps/internal/rpc"
)

// Register adds a handler for method to the server's RPC server, so that other protocols of
// this module (the coordinator's control calls of package elastic) share the server's one
// authenticated port. A call that arrives before its handler is registered gets an
// unknown-method error. Methods 0-255 are the server's own.
func (s *Server) Register(method uint16, h rpc.Handler) error {
	if method < 256 {
		return fmt.Errorf("%w: method %d is reserved", ErrBadConfig, method)
	}
	return s.rpc.Register(method, h)
}
