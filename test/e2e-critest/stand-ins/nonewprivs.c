/*
 * The nonewprivs stand-in of `make e2e-critest` (critest's nonewprivs:1.3 image): installed setuid
 * root, it prints the effective uid it runs with: 0, unless the container has no_new_privs.
 */
#include <stdio.h>
#include <unistd.h>

int main(void) {
  printf("Effective uid: %d\n", (int)geteuid());
  return 0;
}
