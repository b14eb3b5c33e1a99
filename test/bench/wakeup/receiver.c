/* The wake-up floor's C receiver: one unix-socket connection, a byte back for every read (poll loop). */
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

int main(int argc, char **argv) {
  if (argc != 2 || strlen(argv[1]) >= sizeof(((struct sockaddr_un *)0)->sun_path)) return 2;
  int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  strcpy(a.sun_path, argv[1]);
  if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) < 0 || listen(s, 1) < 0) return 1;
  printf("ready\n");
  fflush(stdout);
  int c = accept(s, NULL, NULL);
  if (c < 0) return 1;
  char b[256];
  for (;;) {
    struct pollfd p = {.fd = c, .events = POLLIN};
    if (poll(&p, 1, -1) < 0) return 1;
    ssize_t n = read(c, b, sizeof b);
    if (n <= 0) return 0;
    if (write(c, "k", 1) != 1) return 1;
  }
}
