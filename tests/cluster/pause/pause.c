/*
 * asya-pause: the test node's pod sandbox process (containerd's `sandbox_image`). It holds a
 * pod's namespaces open, reaps the zombies it inherits, and exits on SIGINT/SIGTERM. Real
 * clusters pull registry.k8s.io/pause; no registry is reachable where the tests run, so the
 * test node uses this one (tests/cluster/up builds it with `deploy/images/ocibuild.py`).
 */
#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_stop(int sig) {
  (void)sig;
  _exit(0);
}

static void on_child(int sig) {
  (void)sig;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

int main(int argc, char **argv) {
  if (argc > 1 && argv[1][0] == '-' && argv[1][1] == 'v') {
    puts("asya-pause 1");
    return 0;
  }
  struct sigaction stop = {.sa_handler = on_stop};
  struct sigaction child = {.sa_handler = on_child, .sa_flags = SA_NOCLDSTOP};
  if (sigaction(SIGINT, &stop, NULL) || sigaction(SIGTERM, &stop, NULL) ||
      sigaction(SIGCHLD, &child, NULL)) {
    perror("asya-pause: sigaction");
    return 1;
  }
  if (getpid() != 1) {
    fputs("asya-pause: warning: not running as PID 1, zombies are not reaped here\n", stderr);
  }
  for (;;) {
    pause();
  }
}
