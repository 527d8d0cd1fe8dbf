/* A plain TCP program (socket, bind, listen, accept, connect, send, recv, poll, shutdown,
 * close: nothing of RDMA) that checks every byte it carries. The rsockets test runs it
 * unmodified under LD_PRELOAD=librspreload.so.
 *
 *   tcp_check server ADDR PORT BYTES   receives BYTES, checks the pattern, answers "OK <n>\n"
 *   tcp_check client ADDR PORT BYTES   sends BYTES in writes of varying size, waits for "OK"
 *
 * Exit status 0 when every byte arrived intact, 1 on a socket error, 2 on corruption. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static unsigned char pattern(long i) { return (unsigned char)((i * 131 + (i >> 11)) % 253); }

static int wait_for(int fd, short events) {
    struct pollfd p = { .fd = fd, .events = events };
    int n = poll(&p, 1, 30000);
    if (n <= 0) {
        fprintf(stderr, "poll: %s\n", n ? strerror(errno) : "30 s without progress");
        return -1;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: %s server|client ADDR PORT BYTES\n", argv[0]);
        return 1;
    }
    int server = !strcmp(argv[1], "server");
    long total = atol(argv[4]);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(atoi(argv[3])) };
    if (inet_pton(AF_INET, argv[2], &a.sin_addr) != 1) {
        fprintf(stderr, "bad address %s\n", argv[2]);
        return 1;
    }
    static unsigned char buf[1 << 18];
    int s = socket(AF_INET, SOCK_STREAM, 0);
    if (s < 0) { perror("socket"); return 1; }
    if (server) {
        int one = 1;
        setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(s, (struct sockaddr *)&a, sizeof a) || listen(s, 4)) { perror("bind/listen"); return 1; }
        if (wait_for(s, POLLIN)) return 1;
        int c = accept(s, NULL, NULL);
        if (c < 0) { perror("accept"); return 1; }
        long got = 0;
        while (got < total) {
            if (wait_for(c, POLLIN)) return 1;
            ssize_t n = recv(c, buf, sizeof buf, 0);
            if (n <= 0) { fprintf(stderr, "recv returned %zd after %ld bytes: %s\n", n, got, strerror(errno)); return 1; }
            for (ssize_t i = 0; i < n; i++)
                if (buf[i] != pattern(got + i)) { fprintf(stderr, "byte %ld is corrupt\n", got + i); return 2; }
            got += n;
        }
        char ok[64];
        int len = snprintf(ok, sizeof ok, "OK %ld\n", got);
        if (send(c, ok, len, 0) != len) { perror("send"); return 1; }
        printf("server: received and checked %ld bytes\n", got);
        shutdown(c, SHUT_RDWR);
        close(c);
    } else {
        if (connect(s, (struct sockaddr *)&a, sizeof a)) { perror("connect"); return 1; }
        long sent = 0;
        unsigned seed = 7;
        while (sent < total) {
            long n = 1 + rand_r(&seed) % (long)sizeof buf;
            if (n > total - sent) n = total - sent;
            for (long i = 0; i < n; i++) buf[i] = pattern(sent + i);
            long off = 0;
            while (off < n) {
                if (wait_for(s, POLLOUT)) return 1;
                ssize_t w = send(s, buf + off, n - off, 0);
                if (w <= 0) { perror("send"); return 1; }
                off += w;
            }
            sent += n;
        }
        char ok[64] = { 0 };
        size_t have = 0;
        while (have < sizeof ok - 1 && !memchr(ok, '\n', have)) {
            if (wait_for(s, POLLIN)) return 1;
            ssize_t n = recv(s, ok + have, sizeof ok - 1 - have, 0);
            if (n <= 0) { fprintf(stderr, "no answer from the server\n"); return 1; }
            have += n;
        }
        if (strncmp(ok, "OK ", 3) || atol(ok + 3) != total) { fprintf(stderr, "server said: %s\n", ok); return 2; }
        printf("client: sent %ld bytes, the server checked them\n", sent);
    }
    close(s);
    return 0;
}
