/*
 * Calls RDMATEST ECHO through rpcrdmad from the app's own poll(2) loop instead of rr_wait: the
 * shape of an app that also waits on sockets, timers or other rings (ABI.md section 5, "Event
 * loops"). Keeps IN_FLIGHT calls outstanding, sleeps on rr_fd between completions (rr_arm before,
 * rr_disarm after), and checks every echoed byte.
 * Build: cc -std=c11 -I shm-api/include shm-api/examples/c/event_loop.c -o rdmatest-event-loop
 * Run:   ./rdmatest-event-loop /path/to/app.sock PEER CALLS
 *        prints "CALLS ECHO ok, slept N times"; exit 1 on a failed call, 3 if a sleep outlasts 10 s
 *        (the daemon never woke the descriptor).
 */
#include "rpcrdma.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>

#define RDMATEST 0x20524454u
#define ECHO 1u
#define IN_FLIGHT 8u
#define LEN 200u /* bytes echoed per call (inline: a multiple of 4, no padding) */

struct slot {
    uint32_t args, reply; /* arena offsets */
};

static uint8_t byte_of(uint64_t call, uint32_t i)
{
    return (uint8_t)(call * 7u + i * 13u);
}

/* Submits call number `call` from slot `k`: ECHO of LEN bytes, the arguments inline. */
static int submit(struct rr_app *app, int peer, const struct slot *sl, uint32_t k, uint64_t call)
{
    uint8_t *a = rr_arena_ptr(app, sl[k].args);
    *(uint32_t *)a = htonl(LEN);
    for (uint32_t i = 0; i < LEN; i++)
        a[4 + i] = byte_of(call, i);
    struct rr_sqe s;
    memset(&s, 0, sizeof s);
    s.opcode = RR_OP_CALL;
    s.target = (uint32_t)peer;
    s.user_data = call << 8 | k;
    s.prog = RDMATEST;
    s.vers = 1;
    s.proc_ = ECHO;
    s.msg_off = sl[k].args;
    s.msg_len = 4 + LEN;
    s.reply_off = sl[k].reply;
    s.reply_len = 4 + LEN;
    return rr_submit(app, &s);
}

/* Checks a finished call; its slot number, or -1. */
static int check(struct rr_app *app, const struct rr_cqe *c)
{
    uint64_t call = c->user_data >> 8;
    uint32_t k = (uint32_t)(c->user_data & 0xff);
    if (c->status != RR_OK || c->rpc_stat != 0 || c->msg_len != 4 + LEN || k >= IN_FLIGHT) {
        fprintf(stderr, "call %llu: status %u, accept_stat %u, %u bytes\n", (unsigned long long)call,
                c->status, c->rpc_stat, c->msg_len);
        return -1;
    }
    const uint8_t *r = rr_arena_ptr(app, c->msg_off);
    if (ntohl(*(const uint32_t *)r) != LEN)
        return -1;
    for (uint32_t i = 0; i < LEN; i++)
        if (r[4 + i] != byte_of(call, i)) {
            fprintf(stderr, "call %llu: byte %u differs\n", (unsigned long long)call, i);
            return -1;
        }
    return (int)k;
}

int main(int argc, char **argv)
{
    struct rr_app app;
    struct slot sl[IN_FLIGHT];
    int peer, r;

    if (argc != 4) {
        fprintf(stderr, "usage: %s <app-socket> <peer> <calls>\n", argv[0]);
        return 2;
    }
    uint64_t calls = strtoull(argv[3], NULL, 10);
    if ((r = rr_connect(argv[1], &app)) < 0) {
        fprintf(stderr, "connect: %s\n", strerror(-r));
        return 1;
    }
    if ((peer = rr_peer_index(&app, argv[2])) < 0) {
        fprintf(stderr, "the daemon has no peer named \"%s\"\n", argv[2]);
        return 1;
    }
    for (uint32_t k = 0; k < IN_FLIGHT; k++) {
        int64_t a = rr_arena_alloc(&app, 4 + LEN), b = rr_arena_alloc(&app, 4 + LEN);
        if (a < 0 || b < 0)
            return 1;
        sl[k] = (struct slot){(uint32_t)a, (uint32_t)b};
    }

    uint64_t sent = 0, done = 0, slept = 0;
    for (uint32_t k = 0; k < IN_FLIGHT && sent < calls; k++)
        if (submit(&app, peer, sl, k, sent++) < 0)
            return 1;
    while (done < calls) {
        struct rr_cqe c;
        while (rr_poll(&app, &c) == 1) {
            int k = check(&app, &c);
            if (k < 0)
                return 1;
            done++;
            if (sent < calls && submit(&app, peer, sl, (uint32_t)k, sent++) < 0)
                return 1;
        }
        if (done == calls)
            break;
        r = rr_arm(&app);
        if (r < 0) {
            fprintf(stderr, "detached\n");
            return 1;
        }
        if (r == 1) {
            /* Other descriptors of the app would sit in this set too. */
            struct pollfd p = {rr_fd(&app), POLLIN, 0};
            int n = poll(&p, 1, 10000);
            if (n == 0) {
                fprintf(stderr, "no wake-up in 10 s (%llu of %llu calls done)\n", (unsigned long long)done,
                        (unsigned long long)calls);
                return 3;
            }
            slept++;
            if (rr_disarm(&app) < 0) {
                fprintf(stderr, "the daemon went away\n");
                return 1;
            }
        }
    }
    printf("%llu ECHO ok, slept %llu times\n", (unsigned long long)calls, (unsigned long long)slept);
    rr_close(&app);
    return 0;
}
