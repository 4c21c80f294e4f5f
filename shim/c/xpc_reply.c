/*
 * xpc_reply.c — what the shim does with the answer to an XPC check-in: use the
 * verdict, check in on the Unix socket instead (within the same deadline), or
 * stay stock now. Pure, so the Linux tests run every case (no libxpc here).
 *
 * The rule (issue "libmetalift v4", item 3): never wait for what cannot come.
 * - A verdict: use it.
 * - The daemon declined with "use the socket" (it cannot serve XPC identities:
 *   started with --no-xpc, or a macOS without the per-message audit token):
 *   the socket, at once.
 * - XPC_ERROR_CONNECTION_INTERRUPTED (the daemon exited mid-request; launchd
 *   relaunches it on demand): send the check-in again over XPC, once, within
 *   the same deadline — libxpc's xpc/connection.h says of this error that the
 *   connection is still valid and the message may be sent again (issue v5,
 *   item 7). A second one (session.c counts): the socket.
 * - Every other XPC error before a reply — XPC_ERROR_CONNECTION_INVALID (no
 *   such service: the daemon runs as the per-user agent) or any other: the
 *   socket, at once.
 * - The daemon declined as busy: stock now, no second try (it said why).
 * - No reply by the deadline: stock; the daemon is noted unresponsive
 *   (unresponsive.c) so the next processes do not wait for it too.
 * - A malformed reply: stock, with the decoder's reason.
 */
#include "metalift_shim.h"

enum ml_xpc_next ml_xpc_next_step(int read_result, struct ml_wire_error e)
{
    if (read_result == 0)
        return ML_XPC_USE_VERDICT;
    if (read_result == -ETIMEDOUT)
        return ML_XPC_STOCK_UNRESPONSIVE;
    if (read_result == -EPROTO) {
        if (e.status == ML_WIRE_DECLINED)
            return e.value == ML_DECLINED_USE_SOCKET ? ML_XPC_USE_SOCKET : ML_XPC_STOCK_BUSY;
        return ML_XPC_STOCK_MALFORMED;
    }
    if (read_result == -EAGAIN)
        return ML_XPC_SEND_AGAIN;
    return ML_XPC_USE_SOCKET;
}
