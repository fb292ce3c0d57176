package gateway

import "fmt"

// MaxDecodedElements bounds what one message an agent sends may decode to: its messages, map
// entries and list elements, nested ones included. Decoding costs far more memory than the
// wire (an empty element takes 2 bytes on the wire and about 100 once decoded: a 16 MiB frame
// of empty acknowledgements decoded to 834 MiB), and an installed OS's agent is its lessee's
// program. The largest frame an agent makes holds 512 acknowledgements or updates, or a status
// report of at most 4 096 discovered machines and 256 withheld boots.
const MaxDecodedElements = 1 << 16

// noJSON stands for Connect's JSON codecs: agents speak binary protobuf, and nothing of theirs
// needs JSON, which is bounded only by a count that knows no message type (wirebound.CountJSON).
type noJSON struct{ name string }

func (c noJSON) Name() string { return c.name }

func (c noJSON) Marshal(any) ([]byte, error) { return nil, c.refused() }

func (c noJSON) Unmarshal([]byte, any) error { return c.refused() }

func (c noJSON) refused() error {
	return fmt.Errorf("the gateway does not speak %s: agents send binary protobuf (application/proto, application/grpc)", c.name)
}
