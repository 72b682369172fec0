//go:build !linux

package kubetest_test

import "errors"

func filesystem(string) (int64, int64, error) { return 0, 0, errors.ErrUnsupported }
