// Package readable writes values for people to read: rounded to what a reader can use.
package readable

import "time"

// Duration is d rounded for reading: to the millisecond under a second, to a tenth of a second
// under a minute, else to the second ("350ms", "12.4s", "3m10s"). Pure.
func Duration(d time.Duration) string {
	switch {
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}
