package wait_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/elasticps/elasticps/internal/wait"
)

func TestSleepEndsWithItsContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	assert.ErrorIs(t, wait.Sleep(ctx, time.Hour), context.Canceled, "a done context ends an hour's sleep at once")
	assert.ErrorIs(t, wait.Sleep(ctx, 0), context.Canceled)
	assert.NoError(t, wait.Sleep(context.Background(), 0))
	assert.NoError(t, wait.Sleep(context.Background(), time.Microsecond))
}

func ExampleSleep() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	fmt.Println(wait.Sleep(ctx, time.Hour))
	// Output: context deadline exceeded
}
