package authority

import (
	"fmt"
	"time"

	"github.com/evercert/evercert/dynamiccert"
)

// checkLifetimes refuses a Lifetime or CALifetime beyond dynamiccert.MaxLifetime, and
// a Lifetime whose default CA lifetime (caFactor × Lifetime, used when
// caLifetime is 0) would be, naming the fields and the limit. It runs
// before the defaults are computed, so nothing overflows.
func checkLifetimes(lifetime, caLifetime time.Duration, caFactor int64) error {
	switch {
	case lifetime > dynamiccert.MaxLifetime:
		return fmt.Errorf("the Lifetime %v must be at most %v (MaxLifetime)", lifetime, dynamiccert.MaxLifetime)
	case caLifetime > dynamiccert.MaxLifetime:
		return fmt.Errorf("the CALifetime %v must be at most %v (MaxLifetime)", caLifetime, dynamiccert.MaxLifetime)
	case caLifetime == 0 && lifetime > dynamiccert.MaxLifetime/time.Duration(caFactor):
		return fmt.Errorf("the Lifetime %v must be at most %v while CALifetime is left to its default, %d × Lifetime, which must be at most %v (MaxLifetime); set CALifetime to allow a longer Lifetime",
			lifetime, dynamiccert.MaxLifetime/time.Duration(caFactor), caFactor, dynamiccert.MaxLifetime)
	}
	return nil
}
