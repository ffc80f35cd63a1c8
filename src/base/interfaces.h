// interfaces.h: CHORUS_SOCKET_IFNAME, which network interfaces chorus listens on. The syntax is
// NCCL_SOCKET_IFNAME's: names separated by commas, each a prefix ("eth" takes eth0 and eth1);
// a leading '^' excludes the listed interfaces instead of choosing them; a leading '=' (after the
// '^', if any) matches whole names only. Pure functions (the fuzz targets call them).
#pragma once

#include <string>
#include <vector>

namespace chorus {

struct InterfaceFilter {
  bool exclude = false;
  bool exact = false;
  std::vector<std::string> names;

  bool matches(const std::string& interface) const;
};

// Throws std::invalid_argument saying what is wrong (an empty list or name, a name longer than an
// interface name can be, a character no interface name has).
InterfaceFilter parseInterfaceFilter(const std::string& text);

}  // namespace chorus
