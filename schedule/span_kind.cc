#include "schedule/span_kind.h"

namespace apapo::schedule {

apapo::v1::SpanKind SpanKindOf(Op::Type type) {
  switch (type) {
    case Op::kForward: return apapo::v1::SPAN_KIND_FORWARD;
    case Op::kBackward: return apapo::v1::SPAN_KIND_BACKWARD;
    case Op::kSendActivations:
    case Op::kSendGradients: return apapo::v1::SPAN_KIND_SEND;
    case Op::kAllReduce: return apapo::v1::SPAN_KIND_ALL_REDUCE;
    case Op::kUpdate: return apapo::v1::SPAN_KIND_OPTIMIZER;
    case Op::kFlush: return apapo::v1::SPAN_KIND_FLUSH;
    default: return apapo::v1::SPAN_KIND_UNSPECIFIED;
  }
}

}  // namespace apapo::schedule
