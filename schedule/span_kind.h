// The trace span a schedule op is recorded as (apapoctl trace): the one
// mapping the executor's measured spans and the simulator's timeline share.
// Posting a receive is not a span (its wait is, as the RECV part of the
// forward or backward that takes it): SPAN_KIND_UNSPECIFIED.
#ifndef APAPO_SCHEDULE_SPAN_KIND_H_
#define APAPO_SCHEDULE_SPAN_KIND_H_

#include "proto/apapo/v1/metrics.pb.h"
#include "schedule/schedule.h"

namespace apapo::schedule {

apapo::v1::SpanKind SpanKindOf(Op::Type type);

}  // namespace apapo::schedule

#endif  // APAPO_SCHEDULE_SPAN_KIND_H_
