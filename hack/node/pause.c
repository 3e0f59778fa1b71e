/*
 * The first process of every pod sandbox on the test nodes: it keeps the pod's namespaces alive,
 * reaps orphans re-parented to it (it is PID 1 of the pod when the pod shares its PID namespace),
 * and exits on SIGINT or SIGTERM. Kubernetes' own pause container does the same job
 * (kubernetes/build/pause); no registry is reachable here, so the image is built locally.
 */
#include <signal.h>
#include <stddef.h>
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

int main(void) {
    struct sigaction stop = {0};
    struct sigaction child = {0};
    stop.sa_handler = on_stop;
    child.sa_handler = on_child;
    child.sa_flags = SA_NOCLDSTOP | SA_RESTART;
    if (sigaction(SIGINT, &stop, NULL) != 0 || sigaction(SIGTERM, &stop, NULL) != 0 ||
        sigaction(SIGCHLD, &child, NULL) != 0) {
        return 1;
    }
    for (;;) {
        pause();
    }
}
