/*
 * pause: the first process of a lab pod's sandbox. It holds the pod's
 * namespaces open and does nothing else until it is told to stop.
 *
 *   pause        wait; exit 0 on SIGINT or SIGTERM
 *   pause -v     print the version and exit 0
 *
 * As PID 1 of the pod's PID namespace (when the pod shares one) it also
 * inherits every orphaned process there, so it reaps children on SIGCHLD
 * to keep zombies from piling up.
 *
 * nodelb's own program (docs/decisions.md), built static by
 * scripts/build-runtime.sh: gcc -static -Os.
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>

#define PAUSE_VERSION "nodelb-pause 1"

int main(int argc, char **argv)
{
	sigset_t wanted;
	int sig;

	if (argc == 2 && strcmp(argv[1], "-v") == 0) {
		puts(PAUSE_VERSION);
		return 0;
	}
	if (argc != 1) {
		fprintf(stderr, "usage: %s [-v]\n", argv[0]);
		return 2;
	}

	/*
	 * Take the signals synchronously instead of through handlers: blocked,
	 * they stay pending until sigwait() collects them. (A namespace's PID 1
	 * never sees a signal it neither handles nor blocks: the kernel drops it.)
	 */
	sigemptyset(&wanted);
	sigaddset(&wanted, SIGINT);
	sigaddset(&wanted, SIGTERM);
	sigaddset(&wanted, SIGCHLD);
	if (sigprocmask(SIG_BLOCK, &wanted, NULL) != 0) {
		perror("pause: sigprocmask");
		return 1;
	}

	for (;;) {
		if (sigwait(&wanted, &sig) != 0)
			continue;
		if (sig != SIGCHLD)
			return 0; /* SIGINT or SIGTERM: the sandbox is being stopped */
		/* One pending SIGCHLD may stand for several exits: reap them all. */
		while (waitpid(-1, NULL, WNOHANG) > 0)
			;
	}
}
