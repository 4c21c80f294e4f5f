/*
 * metalift-hostile / metalift-hostile-late: programs that do to their
 * descriptors and processes what real programs do, to test that libmetalift
 * never notices or changes it (probe/tests/hostile.rs).
 *
 * metalift-hostile links the simulated Metal (the shim checks in from its
 * constructor); metalift-hostile-late (-DHOSTILE_LATE) loads it with dlopen
 * from $HOSTILE_METAL when a mode asks for a device. Modes (argv[1]):
 *
 *   closefds OUT     create a device (asking nothing), close every descriptor
 *                    above 2, open OUT (it gets the shim's old number), ask the
 *                    device, check OUT is still the same open file, write to it.
 *   forksetsid OUT   fork; the child calls setsid, closes every descriptor
 *                    (0-2 too), opens OUT on 0 and /dev/null on 1, 2 and 3,
 *                    creates a device, checks 0-3 are still its files, writes
 *                    its answer to OUT. The parent then creates its own device.
 *   stdio OUT        started with 0, 1 and 2 closed: opens OUT (0) and dups it
 *                    onto 1 and 2, creates a device, prints to stdout and stderr.
 *   fork             fork before any device; the child and then the parent
 *                    create the default device and print "<role> <pid> family
 *                    <N>" (with -late: before Metal is loaded).
 *   forkafter        create the default device, fork; the child creates the
 *                    default device again: "<role> <pid> family <N> device
 *                    <pointer>" for the parent, then the child.
 *   forkwait         a thread creates the first device while the daemon is slow
 *                    to answer; meanwhile the main thread forks; the child
 *                    creates the default device (SIGALRM after 15 s: a hang),
 *                    then the parent joins: "child <pid> family <N>" if the
 *                    child got that far, "parent <pid> family <N>", "child
 *                    ended: signal <S>|exit <E>", "fork took <ms> ms" (how long
 *                    fork() held the main thread).
 *   recurse          hook -[_MTLDevice initWorkarounds] (which Metal calls under
 *                    its registration lock) to create the default device again,
 *                    then create it: recursion on Metal's lock.
 *   answers          create the default device and print "apple <N>",
 *                    "rwtexture <N>" (readWriteTextureSupport) and
 *                    "bf16emulation <0|1>" (requiresBFloat16Emulation).
 *   exec             exec `sh -c 'ls /proc/self/fd'` without creating a device.
 *   devexec          create a device (asking it nothing: the shim's outcome
 *                    went out during the creation), then exec as `exec` does.
 *   dlerror [nodevice]  print what dlerror() says first thing in main, after
 *                    creating a device (unless `nodevice`), and after a dlsym of
 *                    a missing symbol of the program's own: one line each,
 *                    "start: <text>|NULL", "device: …", "own: …".
 *
 * Exit status: 0, or 10+ when the program's own descriptors were disturbed.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef void *(*create_fn)(void);
typedef void *(*msg_lookup_fn)(void *, const void *);
typedef const void *(*sel_fn)(const char *);
typedef unsigned char (*supports_fn)(void *, const void *, long);

static void *scope(void)
{
#ifdef HOSTILE_LATE
    static void *handle;
    if (handle == NULL) {
        const char *path = getenv("HOSTILE_METAL");
        handle = path ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : NULL;
        if (handle == NULL) {
            fprintf(stderr, "hostile: cannot load $HOSTILE_METAL\n");
            exit(2);
        }
    }
    return handle;
#else
    return RTLD_DEFAULT;
#endif
}

static void *sym(const char *name)
{
    void *s = dlsym(scope(), name);
    if (s == NULL) {
        fprintf(stderr, "hostile: no %s\n", name);
        exit(2);
    }
    return s;
}

/* Creates the default device and asks it nothing. */
static void *create_device(void)
{
    create_fn create;
    void *s = sym("MTLCreateSystemDefaultDevice");
    memcpy(&create, &s, sizeof s);
    return create();
}

/* Prints `label: <dlerror()>` (NULL when there is no error). */
static void print_dlerror(const char *label)
{
    const char *e = dlerror();
    printf("%s: %s\n", label, e ? e : "NULL");
}

static int dlerror_case(int argc, char **argv)
{
    print_dlerror("start");
    if (argc < 3 || strcmp(argv[2], "nodevice") != 0)
        (void)create_device();
    print_dlerror("device");
    (void)dlsym(RTLD_DEFAULT, "metalift_hostile_no_such_symbol");
    print_dlerror("own");
    return 0;
}

/* objc_msg_lookup(receiver, sel_registerName(name)), as the GCC runtime sends. */
static void *imp_of(void *receiver, const char *name, const void **selector)
{
    msg_lookup_fn lookup;
    sel_fn sel;
    void *s = sym("objc_msg_lookup");
    memcpy(&lookup, &s, sizeof s);
    s = sym("sel_registerName");
    memcpy(&sel, &s, sizeof s);
    *selector = sel(name);
    return lookup(receiver, *selector);
}

/* The highest Apple family `device` claims. */
static int family_of(void *device)
{
    const void *sf;
    supports_fn f = (supports_fn)imp_of(device, "supportsFamily:", &sf);
    int best = 0;
    for (int n = 1; n <= 10; n++)
        if (f(device, sf, 1000 + n))
            best = n;
    return best;
}

/* Creates the default device and returns the highest Apple family it claims. */
static int device_family(void)
{
    return family_of(create_device());
}

struct ident {
    dev_t dev;
    ino_t ino;
};

static struct ident ident_of(int fd)
{
    struct stat st;
    struct ident id = {0, 0};
    if (fstat(fd, &st) == 0) {
        id.dev = st.st_dev;
        id.ino = st.st_ino;
    }
    return id;
}

static int same(int fd, struct ident id)
{
    struct ident now = ident_of(fd);
    return fcntl(fd, F_GETFD) >= 0 && now.dev == id.dev && now.ino == id.ino;
}

static void close_from(int first)
{
    for (int fd = first; fd < 1024; fd++)
        close(fd);
}

static void put(int fd, const char *text)
{
    if (write(fd, text, strlen(text)) < 0)
        exit(11);
}

static int closefds(const char *out)
{
    /* The device first, asking nothing: an unlocked shim's connection is open
     * (the outcome waits for the first question) when every number is closed
     * and the program's own file takes the lowest one. */
    (void)create_device();
    close_from(3);
    int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd != 3)
        return 12;
    struct ident id = ident_of(fd);
    put(fd, "before the device\n");
    char line[64];
    snprintf(line, sizeof line, "family %d\n", device_family());
    if (!same(fd, id))
        return 13;
    put(fd, line);
    put(fd, "after the device: still open\n");
    return close(fd) == 0 ? 0 : 14;
}

static int forksetsid(const char *out)
{
    fflush(NULL);
    pid_t child = fork();
    if (child < 0)
        return 20;
    if (child == 0) {
        setsid();
        close_from(0);
        int o = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int n1 = open("/dev/null", O_RDWR), n2 = open("/dev/null", O_RDWR);
        int n3 = open("/dev/null", O_RDWR);
        if (o != 0 || n1 != 1 || n2 != 2 || n3 != 3)
            _exit(15);
        struct ident ids[4] = {ident_of(0), ident_of(1), ident_of(2), ident_of(3)};
        char line[64];
        snprintf(line, sizeof line, "child family %d\n", device_family());
        for (int fd = 0; fd < 4; fd++)
            if (!same(fd, ids[fd]))
                _exit(16 + fd);
        put(0, line);
        _exit(0);
    }
    int status = 0;
    waitpid(child, &status, 0);
    printf("parent family %d\n", device_family());
    if (!WIFEXITED(status))
        return 21;
    return WEXITSTATUS(status);
}

static int stdio_closed(const char *out)
{
    int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd != 0)
        return 30; /* 0 was not free: the shim sat on it */
    if (dup(fd) != 1 || dup(fd) != 2)
        return 31;
    printf("family %d\n", device_family());
    fflush(stdout);
    fprintf(stderr, "a line on stderr\n");
    return 0;
}

static int fork_both(void)
{
    fflush(NULL);
    pid_t child = fork();
    if (child < 0)
        return 40;
    if (child == 0) {
        printf("child %ld family %d\n", (long)getpid(), device_family());
        fflush(stdout);
        _exit(0);
    }
    int status = 0;
    waitpid(child, &status, 0);
    printf("parent %ld family %d\n", (long)getpid(), device_family());
    return WIFEXITED(status) ? WEXITSTATUS(status) : 41;
}

static int fork_after_registering(void)
{
    void *device = create_device();
    printf("parent %ld family %d device %p\n", (long)getpid(), family_of(device), device);
    fflush(NULL);
    pid_t child = fork();
    if (child < 0)
        return 42;
    if (child == 0) {
        alarm(15);
        void *again = create_device();
        printf("child %ld family %d device %p\n", (long)getpid(), family_of(again), again);
        fflush(NULL);
        _exit(0);
    }
    int status = 0;
    waitpid(child, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 43;
}

/* Prints how `status` ended: "child ended: signal S" or "child ended: exit E". */
static void print_child_end(int status)
{
    if (WIFSIGNALED(status))
        printf("child ended: signal %d\n", WTERMSIG(status));
    else
        printf("child ended: exit %d\n", WEXITSTATUS(status));
}

static void *first_device_thread(void *family)
{
    *(int *)family = device_family();
    return NULL;
}


static int fork_while_waiting(void)
{
    int thread_family = 0;
    pthread_t t;
    if (pthread_create(&t, NULL, first_device_thread, &thread_family) != 0)
        return 60;
    usleep(300 * 1000); /* the thread is now inside its device init, waiting */
    fflush(NULL);
    struct timespec before, after;
    clock_gettime(CLOCK_MONOTONIC, &before);
    pid_t child = fork();
    if (child < 0)
        return 61;
    if (child > 0)
        clock_gettime(CLOCK_MONOTONIC, &after);
    if (child == 0) {
        alarm(15);
        printf("child %ld family %d\n", (long)getpid(), device_family());
        fflush(NULL);
        _exit(0);
    }
    int status = 0;
    waitpid(child, &status, 0);
    pthread_join(t, NULL);
    printf("parent %ld family %d\n", (long)getpid(), thread_family);
    print_child_end(status);
    printf("fork took %ld ms\n", (long)((after.tv_sec - before.tv_sec) * 1000 +
                                        (after.tv_nsec - before.tv_nsec) / 1000000));
    return 0;
}

typedef void (*void_imp)(void *, const void *);
static void_imp original_init_workarounds;

/* -initWorkarounds that creates the default device again, under Metal's lock. */
static void recursing_init_workarounds(void *self, const void *cmd)
{
    fprintf(stderr, "hostile: creating the default device inside -initWorkarounds\n");
    (void)create_device();
    original_init_workarounds(self, cmd);
}

static int recurse(void)
{
    void *(*get_class)(const char *);
    void *(*instance_method)(void *, const void *);
    void_imp (*set_implementation)(void *, void_imp);
    sel_fn sel;
    void *s = sym("objc_getClass");
    memcpy(&get_class, &s, sizeof s);
    s = sym("class_getInstanceMethod");
    memcpy(&instance_method, &s, sizeof s);
    s = sym("method_setImplementation");
    memcpy(&set_implementation, &s, sizeof s);
    s = sym("sel_registerName");
    memcpy(&sel, &s, sizeof s);
    alarm(15); /* a lock that waits for its own owner would hang: SIGALRM */
    void *method = instance_method(get_class("_MTLDevice"), sel("initWorkarounds"));
    if (method == NULL)
        return 70;
    original_init_workarounds = set_implementation(method, recursing_init_workarounds);
    /* GCC's libobjc: refresh the per-class dispatch tables, defining class
     * down (REAL-METAL.md, "Where the Linux runtime differs"). */
    void (*update)(void *);
    s = sym("__objc_update_dispatch_table_for_class");
    memcpy(&update, &s, sizeof s);
    update(get_class("_MTLDevice"));
    update(get_class("IOGPUMetalDevice"));
    update(get_class("AppleParavirtDevice"));
    printf("family %d\n", device_family());
    return 71; /* not reached: the second creation dies */
}

static int answers(void)
{
    void *device = create_device();
    const void *cmd;
    unsigned long (*rw)(void *, const void *) =
        (unsigned long (*)(void *, const void *))imp_of(device, "readWriteTextureSupport", &cmd);
    unsigned long texture = rw(device, cmd);
    unsigned char (*bf)(void *, const void *) =
        (unsigned char (*)(void *, const void *))imp_of(device, "requiresBFloat16Emulation", &cmd);
    unsigned char emulation = bf(device, cmd);
    printf("apple %d\nrwtexture %lu\nbf16emulation %d\n", family_of(device), texture,
           (int)emulation);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    if (strcmp(argv[1], "closefds") == 0 && argc == 3)
        return closefds(argv[2]);
    if (strcmp(argv[1], "forksetsid") == 0 && argc == 3)
        return forksetsid(argv[2]);
    if (strcmp(argv[1], "stdio") == 0 && argc == 3)
        return stdio_closed(argv[2]);
    if (strcmp(argv[1], "fork") == 0)
        return fork_both();
    if (strcmp(argv[1], "forkwait") == 0)
        return fork_while_waiting();
    if (strcmp(argv[1], "forkafter") == 0)
        return fork_after_registering();
    if (strcmp(argv[1], "recurse") == 0)
        return recurse();
    if (strcmp(argv[1], "answers") == 0)
        return answers();
    if (strcmp(argv[1], "dlerror") == 0)
        return dlerror_case(argc, argv);
    if (strcmp(argv[1], "devexec") == 0)
        (void)create_device();
    if (strcmp(argv[1], "exec") == 0 || strcmp(argv[1], "devexec") == 0) {
        execl("/bin/sh", "sh", "-c", "ls /proc/self/fd", (char *)NULL);
        return 50;
    }
    return 2;
}
