// options_fuzz.cc: collbench's command line parser on arbitrary arguments (the input, split at
// newlines). It must return an exit code or go on, never crash. Built as fuzz_collbench_flags by
// tests/fuzz (the fuzz preset).
#include <cstdint>
#include <string>
#include <vector>

#include "bench/options.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> words{"collbench"};
  std::string word;
  for (size_t i = 0; i < size; ++i) {
    const char c = static_cast<char>(data[i]);
    if (c == '\n') {
      words.push_back(word);
      word.clear();
    } else if (c != '\0') {
      word += c;
    }
  }
  words.push_back(word);
  if (words.size() > 64) return 0;
  std::vector<const char*> argv;
  for (const std::string& w : words) argv.push_back(w.c_str());
  chorus::bench::Options options;
  (void)chorus::bench::parseOptions(static_cast<int>(argv.size()), argv.data(), &options);
  return 0;
}
