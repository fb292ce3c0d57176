package gateway

import (
	"fmt"

	"bcd/internal/wirebound"
)

// MaxDecodedElements bounds what one message an agent sends may decode to: its messages, map
// entries and list elements, nested ones included. Decoding costs far more memory than the
// wire (an empty element takes 2 bytes on the wire and about 100 once decoded: a 16 MiB frame
// of empty acknowledgements decoded to 834 MiB), and an installed OS's agent is its lessee's
// program. The largest frame an agent makes holds 512 acknowledgements or updates, or a status
// report of at most 4 096 discovered machines and 256 withheld boots.
const MaxDecodedElements = 1 << 16

// boundedProto is the gateway's protobuf codec (Connect's "proto"): a message is walked on the
// wire, and refused, before it is decoded when it would decode to more than limit elements
// (wirebound.Proto, which the API decodes through too).
type boundedProto struct{ limit int }

func (boundedProto) Name() string { return "proto" }

func (c boundedProto) Marshal(m any) ([]byte, error) { return wirebound.NewProto(c.limit).Marshal(m) }

// MarshalAppend lets Connect reuse its buffers, as its own codec does.
func (c boundedProto) MarshalAppend(dst []byte, m any) ([]byte, error) {
	return wirebound.NewProto(c.limit).MarshalAppend(dst, m)
}

func (c boundedProto) Unmarshal(data []byte, m any) error {
	return wirebound.NewProto(c.limit).Unmarshal(data, m)
}

// noJSON stands for Connect's JSON codecs: agents speak binary protobuf, and nothing of theirs
// needs JSON, which is bounded only by a count that knows no message type (wirebound.CountJSON).
type noJSON struct{ name string }

func (c noJSON) Name() string { return c.name }

func (c noJSON) Marshal(any) ([]byte, error) { return nil, c.refused() }

func (c noJSON) Unmarshal([]byte, any) error { return c.refused() }

func (c noJSON) refused() error {
	return fmt.Errorf("the gateway does not speak %s: agents send binary protobuf (application/proto, application/grpc)", c.name)
}
