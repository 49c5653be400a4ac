/* One-way latency for the emulated hosts of scripts/netlab.sh, where the kernel has no netem:
 * every packet that iptables hands to NFQUEUE queue 0 of this network namespace is held for
 * DELAY microseconds after it arrived, then accepted, in arrival order (a FIFO keeps TCP's
 * segments in order, as a real wire does).
 *
 * Usage: netlab-delay DELAY_US
 * Built by netlab.sh against Debian's libnetfilter-queue-dev.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/socket.h>
#include <arpa/inet.h>
#include <linux/netfilter.h>
#include <libnetfilter_queue/libnetfilter_queue.h>

/* Packets waiting: a ring of (id, due time). Beyond CAP packets held at once the newest is
 * accepted at once rather than dropped (a queue that long means the link is the bottleneck,
 * and tbf already delays it). */
#define CAP 65536
static uint32_t ids[CAP];
static uint64_t due[CAP];
static size_t head, count;
static uint64_t delay_ns;

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static int on_packet(struct nfq_q_handle *q, struct nfgenmsg *msg, struct nfq_data *nfa,
                     void *data) {
    (void)msg;
    (void)data;
    struct nfqnl_msg_packet_hdr *h = nfq_get_msg_packet_hdr(nfa);
    if (!h) return 0;
    uint32_t id = ntohl(h->packet_id);
    if (count == CAP) return nfq_set_verdict(q, id, NF_ACCEPT, 0, NULL);
    size_t tail = (head + count) % CAP;
    ids[tail] = id;
    due[tail] = now_ns() + delay_ns;
    count++;
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s DELAY_US\n", argv[0]);
        return 2;
    }
    delay_ns = strtoull(argv[1], NULL, 10) * 1000ull;
    struct nfq_handle *nh = nfq_open();
    if (!nh) {
        perror("netlab-delay: nfq_open");
        return 1;
    }
    struct nfq_q_handle *q = nfq_create_queue(nh, 0, &on_packet, NULL);
    if (!q) {
        perror("netlab-delay: nfq_create_queue 0");
        return 1;
    }
    if (nfq_set_mode(q, NFQNL_COPY_META, 0) < 0) {
        perror("netlab-delay: nfq_set_mode");
        return 1;
    }
    nfq_set_queue_maxlen(q, CAP);
    int fd = nfq_fd(nh);
    char buf[65536];
    for (;;) {
        struct timespec wait, *until = NULL;
        uint64_t t = now_ns();
        while (count && due[head] <= t) {
            nfq_set_verdict(q, ids[head], NF_ACCEPT, 0, NULL);
            head = (head + 1) % CAP;
            count--;
        }
        if (count) {
            uint64_t left = due[head] - t;
            wait.tv_sec = (time_t)(left / 1000000000ull);
            wait.tv_nsec = (long)(left % 1000000000ull);
            until = &wait;
        }
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int r = ppoll(&p, 1, until, NULL);
        if (r < 0 && errno != EINTR) {
            perror("netlab-delay: poll");
            return 1;
        }
        if (r > 0) {
            ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
            if (n > 0) nfq_handle_packet(nh, buf, (int)n);
        }
    }
}
