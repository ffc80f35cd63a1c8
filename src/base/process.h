// process.h: hearing of another process's exit on this host (a pidfd, readable once the process
// has exited, zombie or not; kill(pid, 0) where the kernel has no pidfd). The transports watch
// their same-host peers with it, the device engine the ranks that share its GPU.
#pragma once

#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

namespace chorus {

// A pidfd for process pid, or -1 where the kernel has none.
inline int pidfdOpen(pid_t pid) { return static_cast<int>(syscall(SYS_pidfd_open, pid, 0)); }
// Whether process pid (pidfd: pidfdOpen's, or -1) has exited. Never blocks.
inline bool processExited(int pidfd, pid_t pid) {
  if (pidfd < 0) return kill(pid, 0) != 0 && errno == ESRCH;
  pollfd exited{pidfd, POLLIN, 0};
  return ::poll(&exited, 1, 0) > 0;
}

}  // namespace chorus
