package store_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/blobplane/blobplane/internal/pgtest"
)

// BenchmarkLeaseRenew measures RENEW round trips per second (ZBP-5 issue
// benchmark): one conditional UPDATE each, with 1 and 16 keepers renewing
// their own partitions concurrently.
func BenchmarkLeaseRenew(b *testing.B) {
	for _, clients := range []int{1, 16} {
		b.Run(fmt.Sprintf("clients=%d", clients), func(b *testing.B) {
			ctx := context.Background()
			st := pgtest.NewStore(b)
			epochs := make([]uint64, clients)
			for i := range clients {
				rec, err := st.AcquireLease(ctx, fmt.Sprintf("p_bench%02d", i), fmt.Sprintf("node-%d", i), "127.0.0.1:1", time.Minute, time.Second)
				if err != nil {
					b.Fatal(err)
				}
				epochs[i] = rec.Epoch
			}
			b.ResetTimer()
			start := time.Now()
			var wg sync.WaitGroup
			per := b.N/clients + 1
			for i := range clients {
				wg.Go(func() {
					for range per {
						if _, err := st.RenewLease(ctx, fmt.Sprintf("p_bench%02d", i), fmt.Sprintf("node-%d", i), epochs[i]); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			b.ReportMetric(float64(per*clients)/time.Since(start).Seconds(), "renews/s")
		})
	}
}
