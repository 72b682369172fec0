//go:build !unix

package kubetest_test

import "errors"

func touchMiB(int) error { return errors.ErrUnsupported }
