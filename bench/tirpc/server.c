/* RDMATEST over ONC RPC/TCP with libtirpc: the comparison server of `rpcrdma-bench compare`.
 * Usage: tirpc-server. Binds 127.0.0.1 on a free port, prints "port N", serves until killed.
 * No rpcbind: the client is given the port. */
#include "rdmatest.h"
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAX_SIZE (4u << 20)

void rdmatest_1(struct svc_req *rqstp, SVCXPRT *transp);

static unsigned char pattern_byte(unsigned seed, unsigned i) { return (unsigned char)(seed + i * 31u + (i >> 8)); }

static char *out_buf;

void *rt_null_1_svc(void *arg, struct svc_req *rq) { static char dummy; (void)arg; (void)rq; return &dummy; }

rt_bytes *rt_echo_1_svc(rt_bytes *arg, struct svc_req *rq) {
	static rt_bytes res;
	(void)rq;
	res = *arg; /* the dispatcher frees the argument only after the reply is sent */
	return &res;
}

rt_bytes *rt_read_1_svc(read_args *arg, struct svc_req *rq) {
	static rt_bytes res;
	(void)rq;
	unsigned n = arg->count > MAX_SIZE ? MAX_SIZE : arg->count;
	for (unsigned i = 0; i < n; i++) out_buf[i] = (char)pattern_byte(arg->seed, i);
	res.rt_bytes_len = n;
	res.rt_bytes_val = out_buf;
	return &res;
}

u_int *rt_write_1_svc(write_args *arg, struct svc_req *rq) {
	static u_int res;
	(void)rq;
	res = 0;
	for (unsigned i = 0; i < arg->data.data_len; i++) res += (unsigned char)arg->data.data_val[i] == pattern_byte(arg->seed, i);
	return &res;
}

void *rt_sleep_1_svc(u_int *us, struct svc_req *rq) {
	static char dummy;
	(void)rq;
	usleep(*us > 1000000 ? 1000000 : *us);
	return &dummy;
}

u_int *rt_callback_1_svc(callback_args *arg, struct svc_req *rq) {
	static u_int res;
	(void)arg; (void)rq;
	res = 0; /* ONC RPC over TCP has no backward direction here */
	return &res;
}

int main(void) {
	out_buf = malloc(MAX_SIZE);
	int s = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = 0 };
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	int one = 1;
	setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (!out_buf || s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) < 0 || listen(s, 16) < 0) { perror("tirpc-server: socket"); return 1; }
	socklen_t len = sizeof a;
	getsockname(s, (struct sockaddr *)&a, &len);
	SVCXPRT *x = svc_vc_create(s, 0, 0);
	/* protocol 0: do not register with rpcbind */
	if (!x || !svc_register(x, RDMATEST, RDMATEST_V1, rdmatest_1, 0)) { fprintf(stderr, "tirpc-server: cannot create the service\n"); return 1; }
	printf("port %d\n", ntohs(a.sin_port));
	fflush(stdout);
	svc_run();
	return 1;
}
