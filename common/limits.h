// Sizes every APapo server and client agree on, so that nothing the
// coordinator accepts can later make a reply too large for a client.
//
// kMaxMessageBytes is gRPC's default receive limit: any gRPC client (C++,
// Python, grpcurl) talks to the coordinator without configuring anything.
// The server receives and sends at most that. A stored JobSpec is capped
// well below it (spec_validator), and list replies stop adding items at
// kMaxPageBytes, continuing on the next page.
//
// Thread-safety: constants only.
#ifndef APAPO_COMMON_LIMITS_H_
#define APAPO_COMMON_LIMITS_H_

#include <cstddef>

namespace apapo {

inline constexpr int kMaxMessageBytes = 4 << 20;
inline constexpr size_t kMaxSpecBytes = 1 << 20;
inline constexpr size_t kMaxPageBytes = kMaxMessageBytes / 2;

// Keepalive on the worker stream. A worker pings the coordinator every
// kKeepaliveTimeMs and drops the connection when a ping goes unanswered for
// kKeepaliveTimeoutMs, so a cut link (no FIN, no RST: writes just queue)
// ends its stream within 15 s and it reconnects; the coordinator accepts
// pings that often. The coordinator finds a silent worker by its missing
// heartbeats (3 intervals); it also pings every connection every
// kServerKeepaliveTimeMs, so that a dead one (a worker gone without a FIN)
// is closed rather than kept (33 pings a second for 1,000 workers).
inline constexpr int kKeepaliveTimeMs = 10000;
inline constexpr int kKeepaliveTimeoutMs = 5000;
inline constexpr int kServerKeepaliveTimeMs = 30000;

}  // namespace apapo

#endif  // APAPO_COMMON_LIMITS_H_
