// Early-return helpers for absl::Status / absl::StatusOr<T>, shared by every
// package instead of hand-written copies:
//
//   APAPO_RETURN_IF_ERROR(store->Save(x));
//   APAPO_ASSIGN_OR_RETURN(Graph graph, GraphFromProfile(profile));
//   APAPO_ASSIGN_OR_RETURN(auto plan, MakePlan(...), Prefix("plan", _));
//
// The optional third argument of APAPO_ASSIGN_OR_RETURN is an expression
// over the failed status `_` that becomes the returned status (to add where
// the error happened). Header-only, no dependencies beyond abseil.
#ifndef APAPO_COMMON_STATUS_MACROS_H_
#define APAPO_COMMON_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define APAPO_STATUS_CONCAT_INNER_(a, b) a##b
#define APAPO_STATUS_CONCAT_(a, b) APAPO_STATUS_CONCAT_INNER_(a, b)

#define APAPO_RETURN_IF_ERROR(expr)                                 \
  do {                                                              \
    if (::absl::Status apapo_status_ = (expr); !apapo_status_.ok()) \
      return apapo_status_;                                         \
  } while (0)

#define APAPO_ASSIGN_OR_RETURN(...)                                      \
  APAPO_STATUS_SELECT_(__VA_ARGS__, APAPO_ASSIGN_OR_RETURN_3_,           \
                       APAPO_ASSIGN_OR_RETURN_2_)                        \
  (__VA_ARGS__)
#define APAPO_STATUS_SELECT_(a, b, c, name, ...) name

#define APAPO_ASSIGN_OR_RETURN_2_(lhs, expr) \
  APAPO_ASSIGN_OR_RETURN_IMPL_(              \
      APAPO_STATUS_CONCAT_(apapo_statusor_, __LINE__), lhs, expr, _)
#define APAPO_ASSIGN_OR_RETURN_3_(lhs, expr, error) \
  APAPO_ASSIGN_OR_RETURN_IMPL_(                     \
      APAPO_STATUS_CONCAT_(apapo_statusor_, __LINE__), lhs, expr, error)
#define APAPO_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr, error) \
  auto statusor = (expr);                                        \
  if (!statusor.ok()) {                                          \
    const ::absl::Status& _ = statusor.status();                 \
    (void)_;                                                     \
    return (error);                                              \
  }                                                              \
  lhs = *std::move(statusor)

#endif  // APAPO_COMMON_STATUS_MACROS_H_
