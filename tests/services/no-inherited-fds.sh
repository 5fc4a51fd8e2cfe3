# shellcheck shell=bash
# Sourced first by every script that starts a long-lived process (the test servers, the test
# cluster, its nodes, the e2e components): closes the descriptors this shell inherited beyond
# stdin, stdout and stderr, so the daemons it starts do not keep them. A lock its caller holds
# on one (/work/bin/with-cluster's flock on fd 9) would otherwise be held by RabbitMQ or the
# cluster for as long as they run, and no other checkout could ever take it.
# (255 and above are bash's own: the script it is reading. No redirection on the loop: bash
# would keep the redirected stream's original in a descriptor the loop then closes, and lose
# stderr. Closing one that is already closed, the glob's own directory, is silent.)
for _fd in /proc/$$/fd/*; do
  _fd="${_fd##*/}"
  if [ "$_fd" -gt 2 ] && [ "$_fd" -lt 255 ]; then eval "exec $_fd>&-"; fi
done
unset _fd
