// Behaviour check of how the cache key reads XLA_FLAGS and LIBTPU_INIT_ARGS
// (patch 0003): XLA_FLAGS as XLA's own parser does
// (xla/parse_flags_from_env.cc), LIBTPU_INIT_ARGS as libtpu does, built from a
// pytorch/xla tree:
//   - env_hash.cpp and sys_util.cpp are compiled as they are in the tree; the
//     check calls upstream's HashXlaEnvVars, which every tree has, so it runs
//     (and fails) on trees that read the flags otherwise;
//   - torch::lazy hashing is the real one (torch headers and libtorch_cpu).
//
// XLA reads a value that does not start with '-' as the name of a file holding
// the flags, splits a quoted value as one flag, stops at the first word that
// is not a flag, and applies the flags in order, so the last of a name wins.
// libtpu splits LIBTPU_INIT_ARGS on whitespace and keeps going (TF's
// GetLibTpuInitArguments: absl::StrSplit(env, ' ')), taking "--flag value"
// forms too; JAX's key hashes every whitespace token of it.
//
// Each check prints "PASS <name>" or "FAIL <name>: <why>"; the exit status is
// the number of failures.

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

#include <torch/csrc/lazy/core/hash.h>

#include "check_report.h"
#include "torch_xla/csrc/runtime/env_hash.h"

namespace {

namespace fs = std::filesystem;
using check_report::failures;
using check_report::Report;
using torch_xla::runtime::hash::HashXlaEnvVars;

const char* const kVariables[] = {"XLA_FLAGS", "LIBTPU_INIT_ARGS"};
// The checks of XLA's own parsing rules: the variable XLA parses.
const char* const kXlaParsed[] = {"XLA_FLAGS"};

torch::lazy::hash_t HashWith(const char* variable, const std::string& value) {
  ::setenv(variable, value.c_str(), 1);
  torch::lazy::hash_t hash = HashXlaEnvVars();
  ::unsetenv(variable);
  return hash;
}

fs::path FlagFile(const std::string& contents) {
  fs::path path = fs::temp_directory_path() /
                  ("xla_flags_check." + std::to_string(::getpid()) + ".flags");
  std::ofstream(path) << contents;
  return path;
}

// The file's contents count, not its name.
std::string FlagFileIsRead() {
  for (const char* variable : kXlaParsed) {
    fs::path path = FlagFile("--xla_foo=1\n");
    torch::lazy::hash_t one = HashWith(variable, path.string());
    FlagFile("--xla_foo=2\n");
    torch::lazy::hash_t two = HashWith(variable, path.string());
    fs::remove(path);
    if (one == two) {
      return std::string(variable) +
             " names a flag file: two contents give one key";
    }
  }
  return "";
}

// A flag file and the same flags in the variable are one setting to XLA.
std::string FlagFileEqualsItsFlagsInline() {
  for (const char* variable : kXlaParsed) {
    fs::path path = FlagFile("--xla_foo=1\n--xla_bar=true\n");
    torch::lazy::hash_t from_file = HashWith(variable, path.string());
    fs::remove(path);
    if (from_file != HashWith(variable, "--xla_foo=1 --xla_bar=true")) {
      return std::string(variable) +
             ": a flag file and its flags inline give two keys";
    }
  }
  return "";
}

// An unreadable flag file is not the same setting as no flags.
std::string UnreadableFlagFileIsNotNoFlags() {
  for (const char* variable : kXlaParsed) {
    if (HashWith(variable, "/nonexistent/xla_flags_check.flags") ==
        HashWith(variable, "")) {
      return std::string(variable) +
             ": an unreadable flag file gives the key of no flags";
    }
  }
  return "";
}

// The last flag of a name wins: "--a=1 --a=2" sets 2, "--a=2 --a=1" sets 1.
std::string LastFlagWins() {
  for (const char* variable : kVariables) {
    if (HashWith(variable, "--xla_foo=1 --xla_foo=2") ==
        HashWith(variable, "--xla_foo=2 --xla_foo=1")) {
      return std::string(variable) +
             ": --xla_foo=1 --xla_foo=2 and --xla_foo=2 --xla_foo=1 give "
             "one key";
    }
    if (HashWith(variable, "--xla_foo=1 --xla_foo=2") !=
        HashWith(variable, "--xla_foo=2")) {
      return std::string(variable) +
             ": --xla_foo=1 --xla_foo=2 and --xla_foo=2 give two keys";
    }
  }
  return "";
}

// --flag="a b" is one flag with the value "a b".
std::string QuotedValueIsOneFlag() {
  for (const char* variable : kXlaParsed) {
    if (HashWith(variable, "--xla_foo=\"a b\"") ==
        HashWith(variable, "--xla_foo=\"a c\"")) {
      return std::string(variable) + ": two quoted values give one key";
    }
  }
  return "";
}

// XLA stops at the first word that is not a flag; what follows it sets
// nothing.
std::string ParsingStopsWhereXlaStops() {
  for (const char* variable : kXlaParsed) {
    if (HashWith(variable, "--xla_foo=1 junk --xla_bar=2") !=
        HashWith(variable, "--xla_foo=1")) {
      return std::string(variable) +
             ": flags after a word that is not a flag change the key";
    }
  }
  return "";
}

// Dump and logging flags stay out, as before.
std::string DumpAndLoggingFlagsStayOut() {
  for (const char* variable : kVariables) {
    if (HashWith(variable, "--xla_foo=1 --xla_dump_to=/tmp/d --v=2") !=
        HashWith(variable, "--xla_foo=1")) {
      return std::string(variable) + ": a dump or logging flag changes the key";
    }
  }
  return "";
}

// libtpu reads every whitespace token: a "--flag value" form does not end
// what is keyed (XLA's rules would stop at "1" and key only --xla_a).
std::string LibtpuArgsAreReadToTheEnd() {
  const char* variable = "LIBTPU_INIT_ARGS";
  if (HashWith(variable, "--xla_a 1 --xla_b=2") ==
      HashWith(variable, "--xla_a 1 --xla_b=3")) {
    return "LIBTPU_INIT_ARGS: a flag after a \"--flag value\" form leaves the "
           "key as is";
  }
  if (HashWith(variable, "--xla_a 1") == HashWith(variable, "--xla_a 2")) {
    return "LIBTPU_INIT_ARGS: the value of a \"--flag value\" form leaves the "
           "key as is";
  }
  if (HashWith(variable, "--xla_a 1 --xla_b 2") ==
      HashWith(variable, "--xla_a 2 --xla_b 1")) {
    return "LIBTPU_INIT_ARGS: values moved between \"--flag value\" forms "
           "give one key";
  }
  return "";
}

// Of "--noflag --flag=true" the last one wins: the two orders are two
// settings, while independent flags may come in any order.
std::string LibtpuNegationOrderIsKeyed() {
  const char* variable = "LIBTPU_INIT_ARGS";
  for (const auto& [a, b] : std::vector<std::pair<const char*, const char*>>{
           {"--noxla_foo --xla_foo=true", "--xla_foo=true --noxla_foo"},
           {"--xla_foo=false --xla_foo", "--xla_foo --xla_foo=false"},
           {"-xla_foo --noxla_foo", "--noxla_foo -xla_foo"}}) {
    if (HashWith(variable, a) == HashWith(variable, b)) {
      return std::string("LIBTPU_INIT_ARGS: \"") + a + "\" and \"" + b +
             "\" give one key";
    }
  }
  if (HashWith(variable, "--xla_a=1 --tpu_b=2 --noxla_c") !=
      HashWith(variable, "--noxla_c --tpu_b=2 --xla_a=1")) {
    return "LIBTPU_INIT_ARGS: independent flags in another order give another "
           "key";
  }
  if (HashWith(variable, "--xla_a=1 --xla_a=2") !=
      HashWith(variable, "--xla_a=2")) {
    return "LIBTPU_INIT_ARGS: --xla_a=1 --xla_a=2 and --xla_a=2 give two keys";
  }
  return "";
}

// Dump and logging flags stay out of LIBTPU_INIT_ARGS's key with their
// values, in either form, and so do dump flags XLA adds later.
std::string LibtpuDumpFlagsStayOut() {
  const char* variable = "LIBTPU_INIT_ARGS";
  if (HashWith(variable,
               "--xla_dump_to /tmp/d --xla_a=1 --v 3 "
               "--xla_dump_include_timestamp --xla_dump_new_setting=x") !=
      HashWith(variable, "--xla_a=1")) {
    return "LIBTPU_INIT_ARGS: a dump or logging flag changes the key";
  }
  return "";
}

}  // namespace

int main() {
  for (const char* variable : kVariables) ::unsetenv(variable);
  Report("flag_file_is_read", FlagFileIsRead());
  Report("flag_file_equals_its_flags_inline", FlagFileEqualsItsFlagsInline());
  Report("unreadable_flag_file_is_not_no_flags",
         UnreadableFlagFileIsNotNoFlags());
  Report("last_flag_wins", LastFlagWins());
  Report("quoted_value_is_one_flag", QuotedValueIsOneFlag());
  Report("parsing_stops_where_xla_stops", ParsingStopsWhereXlaStops());
  Report("dump_and_logging_flags_stay_out", DumpAndLoggingFlagsStayOut());
  Report("libtpu_args_are_read_to_the_end", LibtpuArgsAreReadToTheEnd());
  Report("libtpu_negation_order_is_keyed", LibtpuNegationOrderIsKeyed());
  Report("libtpu_dump_flags_stay_out", LibtpuDumpFlagsStayOut());
  return failures;
}
