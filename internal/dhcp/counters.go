package dhcp

import (
	"context"
	"sync/atomic"

	"github.com/insomniacslk/dhcp/dhcpv4"
)

// What Counters counts each packet by: the request's message type, the reply's type, and why a
// request got no reply. Each is a small fixed set (the labels of the site agent's metrics):
// nothing from a packet's addresses becomes one.

// RequestType is a request's DHCP message type, as counted.
type RequestType uint8

const (
	RequestDiscover RequestType = iota
	RequestRequest
	RequestDecline
	RequestRelease
	RequestInform
	RequestOther     // any other message type, or none
	RequestMalformed // not a DHCP packet
	NumRequestTypes
)

// String is the type's label.
func (t RequestType) String() string {
	return [...]string{"discover", "request", "decline", "release", "inform", "other", "malformed"}[t]
}

// requestType classifies a parsed request (from the option's raw byte: no parse, no
// allocation on the packet path). Pure.
func requestType(req *dhcpv4.DHCPv4) RequestType {
	b := req.Options.Get(dhcpv4.OptionDHCPMessageType)
	if len(b) != 1 {
		return RequestOther
	}
	switch dhcpv4.MessageType(b[0]) {
	case dhcpv4.MessageTypeDiscover:
		return RequestDiscover
	case dhcpv4.MessageTypeRequest:
		return RequestRequest
	case dhcpv4.MessageTypeDecline:
		return RequestDecline
	case dhcpv4.MessageTypeRelease:
		return RequestRelease
	case dhcpv4.MessageTypeInform:
		return RequestInform
	}
	return RequestOther
}

// ReplyType is a reply's type, as counted: proxy mode's offers and acknowledgements carry no
// address and are counted apart.
type ReplyType uint8

const (
	ReplyOffer ReplyType = iota
	ReplyAck
	ReplyNak
	ReplyProxyOffer
	ReplyProxyAck
	NumReplyTypes
)

// String is the type's label.
func (t ReplyType) String() string {
	return [...]string{"offer", "ack", "nak", "proxy_offer", "proxy_ack"}[t]
}

// replyType classifies a reply of mode; ok is false for a response that is no reply. Pure.
func replyType(mode Mode, resp *dhcpv4.DHCPv4) (ReplyType, bool) {
	proxy := mode == ModeProxy
	switch resp.MessageType() {
	case dhcpv4.MessageTypeOffer:
		if proxy {
			return ReplyProxyOffer, true
		}
		return ReplyOffer, true
	case dhcpv4.MessageTypeAck:
		if proxy {
			return ReplyProxyAck, true
		}
		return ReplyAck, true
	case dhcpv4.MessageTypeNak:
		return ReplyNak, true
	}
	return 0, false
}

// Unanswered is why a request got no reply.
type Unanswered uint8

const (
	// UnansweredOther: the chain ended without a reply and without saying why (kept for
	// handlers that do not; none of this package's).
	UnansweredOther          Unanswered = iota
	UnansweredMalformed                 // not a DHCP packet, or no reply could be built from it
	UnansweredNotBootRequest            // not an Ethernet BOOTREQUEST with a 6-byte MAC
	UnansweredNotServed                 // arrived on a socket this mode does not answer on
	UnansweredObserved                  // observe mode: learned from, never answered
	UnansweredNotNetboot                // proxy mode: not a PXE or HTTP-boot client
	UnansweredNoBinary                  // proxy mode: a network-boot client with no binary for its firmware
	UnansweredOtherServer               // a REQUEST that names another server (the client chose its offer)
	UnansweredMessageType               // a message type this mode does not answer
	UnansweredReleased                  // full mode: RELEASE or DECLINE, recorded; no reply is due
	UnansweredNoPool                    // full mode: no pool for the client's subnet
	UnansweredPoolExhausted             // full mode: no free address in the pool
	UnansweredLeaseNotSaved             // full mode: the lease store failed, so no acknowledgement
	UnansweredSendFailed                // the reply could not be sent
	NumUnanswered
)

// String is the reason's label.
func (u Unanswered) String() string {
	return [...]string{"other", "malformed", "not_boot_request", "not_served", "observed", "not_netboot", "no_binary",
		"other_server", "message_type", "released", "no_pool", "pool_exhausted", "lease_not_saved", "send_failed"}[u]
}

// Counters count what the service did with each request; the caller reads them (a Prometheus
// collector). Given in Config, they outlive the service (the site agent starts a new one each
// time it takes the boot lease).
type Counters struct {
	// Replies decided, by kind (Handle), and requests no reply was decided for.
	Offers  atomic.Uint64
	Acks    atomic.Uint64
	Naks    atomic.Uint64
	Ignored atomic.Uint64
	// Requests by message type (Handle, and the packets read that do not parse), replies sent
	// by type, and requests that got no reply by reason: once every request read is done,
	// the requests counted are the replies sent and the unanswered together.
	Requests   [NumRequestTypes]atomic.Uint64
	Sent       [NumReplyTypes]atomic.Uint64
	Unanswered [NumUnanswered]atomic.Uint64
}

// whyCtx is a request's context in the chain: where a handler says why it does not answer
// (drop). One allocation per request, for both the context and the reason.
type whyCtx struct {
	context.Context
	why Unanswered
}

// drop ends the chain without a reply, saying why (counted by Handle).
func drop(ctx context.Context, resp *dhcpv4.DHCPv4, why Unanswered) bool {
	clearType(resp)
	if c, ok := ctx.(*whyCtx); ok {
		c.why = why
	}
	return true
}
