/* Redlock over N independent Redis nodes, two clients, discrete time.
 *
 * What is modelled (leasehold-redis's RedlockBackend, one acquisition per client):
 * - a client notes the instant t0 before its first request and asks every node (SET NX PX
 *   ttl); a request can be lost or answered too late (it then counts as failed), or find the
 *   node down; time may pass before the last reply is in;
 * - the grant needs a majority (N/2+1) AND validity left: the lease ends at t0 + TTL - DRIFT on
 *   the client's clock; on failure the client deletes its value on every node (compare-and-
 *   delete);
 * - a holder checks its validity and then uses the resource ("in CS"); without pauses it always
 *   leaves before its deadline (time cannot pass its deadline while it is inside);
 * - a node's key expires on the node's own clock: now + off[i].
 *
 * Faults, each switched on by a macro (the runs in models/check say which they enable):
 *   PAUSE       a holder can be paused inside the CS past its deadline (GC, SIGSTOP);
 *   JUMP        node 0's clock jumps forward by TTL at some moment;
 *   RESTART     node 0 restarts at some moment without its keys;
 *   DELAYED     with RESTART: the node stays down for TTL after it restarts (antirez's
 *               mitigation: a restarted node takes no request until every key it had is
 *               expired anyway).
 * Property: no two clients in the CS at once (asserted as a client enters the CS, the only step
 * that can break it).
 *
 * Bounds: N nodes (3 or 5), 2 clients, one acquisition each, TTL ticks, time up to MAXT.
 */
#ifndef N
#define N 3
#endif
#define Q (N / 2 + 1)
#define TTL 3
#define DRIFT 1
#define MAXT (2 * TTL)

byte now = 0;
byte val[N];          /* owner on the node: client + 1, 0 = none */
byte exp[N];          /* expiry, on the node's own clock */
byte off[N];          /* the node's clock runs at now + off[i] */
byte down_until[N];   /* DELAYED: the node refuses requests before this instant */
bool in_cs[2];
byte deadline[2];

#define LIVE(i) (val[i] != 0 && now + off[i] < exp[i])

proctype Client(byte me) {
    byte t0, got = 0, i = 0;
    /* The fan-out, in one step at t0. A request that lands later than t0 sets a key that expires
     * later, which only helps safety; so landing at t0 is the worst case, and replies that take
     * time are modelled by letting the clock run before the validity check below. */
    atomic {
        t0 = now;
        do
        :: i < N ->
           if
           :: now >= down_until[i] && !LIVE(i) ->
              val[i] = me + 1; exp[i] = now + off[i] + TTL; got++;
              printf("MSC: t=%d client %d -> node %d: SET NX PX %d -> OK\n", now, me, i, TTL)
           :: now >= down_until[i] && LIVE(i) ->
              printf("MSC: t=%d client %d -> node %d: SET NX PX %d -> held by client %d\n", now, me, i, TTL, val[i] - 1)
           :: true ->
              printf("MSC: t=%d client %d -> node %d: no answer within the timeout\n", now, me, i)
           fi;
           i++
        :: else -> break
        od
    }
    /* the last reply comes in: success needs a majority and validity left */
    atomic {
        if
        :: got >= Q && now < t0 + TTL - DRIFT ->
           deadline[me] = t0 + TTL - DRIFT;
           printf("MSC: t=%d client %d: %d of %d nodes, valid until t=%d: lock held\n", now, me, got, N, deadline[me])
        :: else ->
           printf("MSC: t=%d client %d: %d of %d nodes or no validity left: failed, releasing all\n", now, me, got, N);
           i = 0;
           do
           :: i < N -> if :: val[i] == me + 1 -> val[i] = 0 :: else -> skip fi; i++
           :: else -> break
           od;
           goto finished
        fi
    }
    /* check the validity, then use the resource */
    atomic { now < deadline[me] -> assert(!(in_cs[0] || in_cs[1])); in_cs[me] = true; printf("MSC: t=%d client %d: writes to the resource (holds the lock)\n", now, me) }
    atomic {
        in_cs[me] = false; printf("MSC: t=%d client %d: done, releasing\n", now, me);
        i = 0;
        do
        :: i < N -> if :: val[i] == me + 1 -> val[i] = 0 :: else -> skip fi; i++
        :: else -> break
        od
    }
finished:
    skip
}

#ifdef PAUSE
#define HOLDS_TIME(c) true
#else
#define HOLDS_TIME(c) (!in_cs[c] || now + 1 < deadline[c])
#endif

proctype Clock() {
    byte c;
    do
    :: atomic {
           now < MAXT && HOLDS_TIME(0) && HOLDS_TIME(1) -> now++;
           c = 0;
           do
           :: c < 2 ->
              if
              :: in_cs[c] && now == deadline[c] ->
                 printf("MSC: t=%d client %d: paused inside the CS; its validity has ended\n", now, c)
              :: else -> skip
              fi;
              c++
           :: else -> break
           od
       }
    od
}

#ifdef JUMP
proctype Jump() {
    atomic { off[0] = TTL; printf("MSC: t=%d node 0: clock jumps forward by %d\n", now, TTL) }
}
#endif

#ifdef RESTART
proctype Restart() {
    atomic {
        val[0] = 0;
#ifdef DELAYED
        down_until[0] = now + TTL;
        printf("MSC: t=%d node 0: restarts empty, takes no request before t=%d\n", now, down_until[0])
#else
        printf("MSC: t=%d node 0: restarts empty (no persistence)\n", now)
#endif
    }
}
#endif

init {
    atomic {
        run Clock();
        run Client(0);
        run Client(1)
#ifdef JUMP
        ; run Jump()
#endif
#ifdef RESTART
        ; run Restart()
#endif
    }
}
