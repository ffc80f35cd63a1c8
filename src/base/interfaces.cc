// interfaces.cc: CHORUS_SOCKET_IFNAME's parser (interfaces.h).
#include "src/base/interfaces.h"

#include <net/if.h>

#include <stdexcept>

namespace chorus {

bool InterfaceFilter::matches(const std::string& interface) const {
  bool listed = false;
  for (const std::string& name : names) {
    listed = listed || (exact ? interface == name : interface.compare(0, name.size(), name) == 0);
  }
  return listed != exclude;
}

InterfaceFilter parseInterfaceFilter(const std::string& text) {
  InterfaceFilter filter;
  size_t at = 0;
  if (at < text.size() && text[at] == '^') {
    filter.exclude = true;
    ++at;
  }
  if (at < text.size() && text[at] == '=') {
    filter.exact = true;
    ++at;
  }
  if (at == text.size()) throw std::invalid_argument("no interface is named");
  for (;;) {
    const size_t comma = text.find(',', at);
    const std::string name = text.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    if (name.empty()) throw std::invalid_argument("an empty interface name (two commas, or one at an end)");
    if (name.size() >= IFNAMSIZ) {
      throw std::invalid_argument("'" + name + "' is longer than an interface name can be (" +
                                  std::to_string(IFNAMSIZ - 1) + " characters)");
    }
    for (const char c : name) {
      if (c <= ' ' || c == '/' || c == 127 || static_cast<unsigned char>(c) >= 128) {
        throw std::invalid_argument("'" + name + "' holds a character no interface name has");
      }
    }
    filter.names.push_back(name);
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return filter;
}

}  // namespace chorus
