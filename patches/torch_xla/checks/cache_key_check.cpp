// Behaviour check of the persistent cache key of patch 0003, built from a
// pytorch/xla tree:
//   - runtime/cache_key.cpp (CanonicalHloText, DiskKey) is compiled as it is
//     in the tree; a tree without it fails to build, naming it;
//   - torch::lazy hashing is the real one (torch headers and libtorch_cpu),
//     and so is LLVM's SHA-256 (libLLVMSupport) behind the disk key;
//   - canonical_hlo_cases.inc is generated from the one table of cases
//     (patches/torch_xla/checks/canonical_hlo_cases.toml) by
//     xla_wheels.series_checks.programs, with each module's canonical text as
//     the Python rules (xla_host.gate.hlo_canonical) give it, so this program
//     also proves that both languages give one text.
//
// Each check prints "PASS <name>" or "FAIL <name>: <why>"; the exit status is
// the number of failures.

#include <initializer_list>
#include <string>
#include <vector>

#include <torch/csrc/lazy/core/hash.h>

#include "check_report.h"
#include "torch_xla/csrc/runtime/cache_key.h"

namespace {

using check_report::failures;
using check_report::Report;
using torch_xla::runtime::cache_key::CanonicalHloText;
using torch_xla::runtime::cache_key::DiskKey;
using torch_xla::runtime::cache_key::DiskKeyInputs;

struct Case {
  const char* name;
  bool equal;  // one program (equal fingerprints) or two
  const char* a;
  const char* b;
  const char* python_a;  // the Python rules' canonical text of a
  const char* python_b;
};

const Case kCases[] = {
#include "canonical_hlo_cases.inc"
};

// Every case of the table: equal canonical texts for one program, different
// ones for two.
std::string TableCasesHold() {
  for (const Case& c : kCases) {
    const bool equal = CanonicalHloText(c.a) == CanonicalHloText(c.b);
    if (equal != c.equal) {
      return std::string(c.name) + ": the canonical texts are " +
             (equal ? "equal" : "different") + ", the table says " +
             (c.equal ? "equal" : "different");
    }
  }
  return "";
}

// The C++ rules and the Python rules give one text for every module.
std::string CanonicalTextEqualsThePythonRules() {
  for (const Case& c : kCases) {
    for (const auto& [text, python] :
         {std::pair<const char*, const char*>{c.a, c.python_a},
          std::pair<const char*, const char*>{c.b, c.python_b}}) {
      const std::string cpp = CanonicalHloText(text);
      if (cpp != python) {
        return std::string(c.name) + ": C++ gives\n" + cpp +
               "\nPython gives\n" + python;
      }
    }
  }
  return "";
}

DiskKeyInputs BaseInputs() {
  DiskKeyInputs inputs;
  inputs.canonical_module = "HloModule m\n";
  inputs.compile_options = "options";
  inputs.debug_options = "debug";
  inputs.xla_flags = "--xla_a=1\n";
  inputs.libtpu_init_args = "--tpu_b=2\n";
  inputs.compile_switches = "stablehlo=0 shardy=0 tpu_megacore=";
  inputs.runtime = "platform=tpu\nversion=libtpu 0.0.36\n";
  inputs.revisions = "torch=a torch_xla=b openxla=c";
  return inputs;
}

using Field = std::string DiskKeyInputs::*;
const std::vector<std::pair<const char*, Field>> kFields = {
    {"canonical_module", &DiskKeyInputs::canonical_module},
    {"compile_options", &DiskKeyInputs::compile_options},
    {"debug_options", &DiskKeyInputs::debug_options},
    {"xla_flags", &DiskKeyInputs::xla_flags},
    {"libtpu_init_args", &DiskKeyInputs::libtpu_init_args},
    {"compile_switches", &DiskKeyInputs::compile_switches},
    {"runtime", &DiskKeyInputs::runtime},
    {"revisions", &DiskKeyInputs::revisions},
};

// Each input, changed alone, changes the key; the same inputs give one key.
std::string EveryInputChangesTheKey() {
  const auto base = DiskKey(BaseInputs());
  if (DiskKey(BaseInputs()) != base) return "one set of inputs gives two keys";
  for (const auto& [name, field] : kFields) {
    DiskKeyInputs changed = BaseInputs();
    changed.*field += "x";
    if (DiskKey(changed) == base) {
      return std::string("changing ") + name + " leaves the key as is";
    }
  }
  return "";
}

// Bytes moved from one input to the next give another key: the inputs are
// length-prefixed, never one stream.
std::string InputsCannotRunIntoEachOther() {
  for (size_t i = 0; i + 1 < kFields.size(); ++i) {
    DiskKeyInputs left = BaseInputs();
    DiskKeyInputs right = BaseInputs();
    left.*kFields[i].second = "ab";
    left.*kFields[i + 1].second = "c";
    right.*kFields[i].second = "a";
    right.*kFields[i + 1].second = "bc";
    if (DiskKey(left) == DiskKey(right)) {
      return std::string(kFields[i].first) + " and " + kFields[i + 1].first +
             " run into each other";
    }
  }
  return "";
}

// The key of a module is the key of its canonical text: one program lowered
// twice (other names, metadata) gives one key, two programs two keys.
std::string ModuleKeyFollowsTheCanonicalText() {
  for (const Case& c : kCases) {
    DiskKeyInputs a = BaseInputs();
    DiskKeyInputs b = BaseInputs();
    a.canonical_module = CanonicalHloText(c.a);
    b.canonical_module = CanonicalHloText(c.b);
    if ((DiskKey(a) == DiskKey(b)) != c.equal) {
      return std::string(c.name) + ": the disk keys do not follow the table";
    }
  }
  return "";
}

// The key as text: a SHA-256 in hex, or (a tree whose DiskKey is torch's
// 128-bit hash) that hash as torch prints it.
std::string KeyText(const std::string& key) { return key; }
std::string KeyText(const torch::lazy::hash_t& key) {
  return torch::lazy::HashToString(key);
}

// The disk key is the SHA-256 of the documented stream: the format version
// and each input, each length-prefixed, as uint64 little-endian. The expected
// value was computed with Python's hashlib, independently of this tree:
//   fields = [b"m", b"o", b"", b"--xla_a=1\n", b"", b"s", b"r", b"v"]
//   stream = struct.pack("<Q", 2) + b"".join(
//       struct.pack("<Q", len(f)) + f for f in fields)
//   hashlib.sha256(stream).hexdigest()
// (format version 2). Entries on a mount other hosts write must not collide:
// a 128-bit non-cryptographic hash is not that.
std::string DiskKeyIsTheSha256OfTheStream() {
  DiskKeyInputs inputs;
  inputs.canonical_module = "m";
  inputs.compile_options = "o";
  inputs.xla_flags = "--xla_a=1\n";
  inputs.compile_switches = "s";
  inputs.runtime = "r";
  inputs.revisions = "v";
  const std::string expected =
      "c626c317e2f79d21eae264fe7825cd82efa855d6429d1c6a6de94e84abc34ea9";
  const std::string key = KeyText(DiskKey(inputs));
  if (key != expected) {
    return "the disk key is " + key + ", not the SHA-256 " + expected;
  }
  return "";
}

}  // namespace

int main() {
  Report("table_cases_hold", TableCasesHold());
  Report("canonical_text_equals_the_python_rules",
         CanonicalTextEqualsThePythonRules());
  Report("every_input_changes_the_key", EveryInputChangesTheKey());
  Report("inputs_cannot_run_into_each_other", InputsCannotRunIntoEachOther());
  Report("module_key_follows_the_canonical_text",
         ModuleKeyFollowsTheCanonicalText());
  Report("disk_key_is_the_sha256_of_the_stream",
         DiskKeyIsTheSha256OfTheStream());
  return failures;
}
