/*
 * The nginx stand-in of `make e2e-critest` (critest's nginx:1.14-2 and hostnet-nginx images). What
 * critest's specs look at: a process named nginx whose command line says "master process", its pid
 * in /var/run/nginx.pid, and HTTP 200 on $NGINX_PORT (default 80). busybox httpd serves, as a child,
 * so this process stays the one critest finds (and pid 1 in its own pid namespace).
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define TITLE "nginx: master process nginx -g daemon off;"

int main(int argc, char **argv) {
  (void)argc;
  if (strcmp(argv[0], TITLE) != 0) {
    /* nginx's own process title is what /proc/<pid>/cmdline shows; comm stays "nginx" from the path. */
    execl("/usr/sbin/nginx", TITLE, (char *)NULL);
    perror("exec /usr/sbin/nginx");
    return 1;
  }
  const char *port = getenv("NGINX_PORT");
  if (!port || !*port) port = "80";

  /* Signals are taken with sigwaitinfo: blocked ones reach a pid-namespace init that has no handler. */
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGQUIT);
  sigaddset(&set, SIGCHLD);
  sigprocmask(SIG_BLOCK, &set, NULL);

  FILE *f = fopen("/var/run/nginx.pid", "w");
  if (f) {
    fprintf(f, "%d\n", (int)getpid());
    fclose(f);
  }
  pid_t child = fork();
  if (child < 0) {
    perror("fork");
    return 1;
  }
  if (child == 0) {
    sigprocmask(SIG_UNBLOCK, &set, NULL);
    execl("/bin/busybox", "httpd", "-f", "-p", port, "-h", "/usr/share/nginx/html", (char *)NULL);
    perror("exec busybox httpd");
    _exit(127);
  }
  fprintf(stderr, "nginx stand-in: pid %d, busybox httpd (pid %d) on port %s\n", (int)getpid(), (int)child, port);
  for (;;) {
    siginfo_t info;
    if (sigwaitinfo(&set, &info) < 0) continue;
    if (info.si_signo == SIGCHLD) {
      int status;
      pid_t p;
      while ((p = waitpid(-1, &status, WNOHANG)) > 0) {
        if (p == child) {
          fprintf(stderr, "nginx stand-in: httpd exited (status %d)\n", status);
          return 1;
        }
      }
      continue;
    }
    kill(child, SIGTERM);
    waitpid(child, NULL, 0);
    return 0;
  }
}
