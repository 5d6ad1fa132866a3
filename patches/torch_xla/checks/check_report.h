// The output contract every check program of the series keeps (read by
// xla_wheels.series_checks.run): one line per check, "PASS <name>" or
// "FAIL <name>: <why>", and an exit status equal to the number of failures.
#ifndef XLA_WHEELS_CHECK_REPORT_H_
#define XLA_WHEELS_CHECK_REPORT_H_

#include <iostream>
#include <string>

namespace check_report {

inline int failures = 0;

// An empty `why` is a pass.
inline void Report(const std::string& name, const std::string& why) {
  std::cout << (why.empty() ? "PASS " : "FAIL ") << name
            << (why.empty() ? "" : ": " + why) << std::endl;
  if (!why.empty()) ++failures;
}

}  // namespace check_report

#endif  // XLA_WHEELS_CHECK_REPORT_H_
