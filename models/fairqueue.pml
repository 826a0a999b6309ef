/* leasehold-redis's fair mode: the line kept on the server by the ACQUIRE_FAIR and RELEASE
 * scripts (crates/leasehold-redis/src/scripts.rs), C clients, discrete server time.
 *
 * Server state, as the scripts keep it: the lock (holder, expiry), the line (a list of owners)
 * and the waiters' zset (owner -> server time until which the waiter counts as alive). Each
 * script runs atomically, as Redis runs a script:
 *   SET NX       a try (the uncontended path, a plain command): grants if the lock is free,
 *                whatever the line says;
 *   ACQUIRE_FAIR a waiting attempt: claims a lock handed to us (it holds our value: re-armed for
 *                TTL); else drops heads of the line whose time ran out; grants (SET PX ttl) only
 *                if the lock is free AND the line is empty or we are its head (leaving the line);
 *                else joins the line if not in the zset yet, and sets our alive time to now + GRACE;
 *   RELEASE      leaves the line (if in the zset); then, if the lock holds our value, hands it to
 *                the first waiter of the line still alive (popping the dead ones): sets it to that
 *                waiter's value for GRACE; with no live waiter, deletes it.
 * Clients: each takes the lock R times (client 0 each time either trying once first, SET NX, or
 * not: one trying client is enough to overtake waiters, and keeps the search small); a
 * waiter asks again before its GRACE runs out (it polls, or is woken by the release message
 * naming it); a holder uses the resource and releases before its validity (t0 + TTL - DRIFT)
 * ends: time cannot pass its deadline while it holds. A try that finds a free lock while others
 * are in line would overtake them: BOUNDED verified with tries says that never happens (the
 * lock is handed over, never left free, while someone is in line).
 *
 * Properties:
 *   EXCLUSION  no two clients hold at once (asserted as a client enters, see enter);
 *   BOUNDED    while a client waits, the others are granted at most C - 1 times in all: FIFO
 *              up to the ones already ahead (assert at each grant);
 *   PROGRESS   every client completes its R acquisitions: no deadlock (spin's end states).
 * -DPLAIN replaces ACQUIRE_FAIR by the default mode's SET NX (no line): BOUNDED must then fail,
 * which is the starvation measured in the default mode.
 *
 * Bounds: C clients, R acquisitions each, TTL, GRACE, time up to MAXT.
 */
#ifndef C
#define C 3
#endif
#ifndef R
#define R 2
#endif
#define TTL 3
#define DRIFT 1
#define GRACE 2
#define MAXT 12

byte now = 0;
byte holder = 0;            /* client + 1, 0 = free */
byte lock_exp = 0;
byte line[C];               /* client + 1, head at 0 */
byte qlen = 0;
byte alive[C];              /* zset score; 0 = not in the zset */
bool waiting[C];            /* ghost: asked at least once in this acquisition, not granted yet */
byte overtaken[C];          /* ghost: grants to others since this client began waiting */
bool in_cs[C];
byte deadline[C];

#define LOCKED (holder != 0 && now < lock_exp)

inline pop_head() {
    j = 0;
    do
    :: j + 1 < qlen -> line[j] = line[j + 1]; j++
    :: else -> break
    od;
    qlen--;
    line[qlen] = 0
}

inline leave_line(c) {
    /* LREM line 1 c */
    j = 0;
    do
    :: j < qlen && line[j] != c + 1 -> j++
    :: else -> break
    od;
    if
    :: j < qlen ->
       do
       :: j + 1 < qlen -> line[j] = line[j + 1]; j++
       :: else -> break
       od;
       qlen--;
       line[qlen] = 0
    :: else -> skip
    fi
}

inline grant(me) {
    holder = me + 1; lock_exp = now + TTL; got = 1;
    printf("MSC: t=%d client %d: granted\n", now, me);
    waiting[me] = false; overtaken[me] = 0;
    j = 0;
    do
    :: j < C ->
       if
       :: j != me && waiting[j] -> overtaken[j]++; assert(overtaken[j] <= C - 1)
       :: else -> skip
       fi;
       j++
    :: else -> break
    od
}

/* A try: plain SET NX, in both modes. */
inline try_set(me) {
    got = 0;
    if
    :: !LOCKED -> grant(me); printf("MSC: t=%d client %d: SET NX (try) -> OK\n", now, me)
    :: else -> skip
    fi
}

inline acquire(me) {
    got = 0;
#ifdef PLAIN
    if
    :: !LOCKED -> grant(me)
    :: else -> waiting[me] = true; printf("MSC: t=%d client %d: SET NX -> held, waits\n", now, me)
    fi
#else
    if
    :: LOCKED && holder == me + 1 ->
       /* handed to us by a release: claim it */
       lock_exp = now + TTL; alive[me] = 0; got = 1;
       printf("MSC: t=%d client %d: claims the lock handed to it\n", now, me);
       waiting[me] = false; overtaken[me] = 0;
       j = 0;
       do
       :: j < C ->
          if
          :: j != me && waiting[j] -> overtaken[j]++; assert(overtaken[j] <= C - 1)
          :: else -> skip
          fi;
          j++
       :: else -> break
       od
    :: else -> skip
    fi;
    if
    :: got -> skip
    :: else ->
    do
    :: qlen > 0 && alive[line[0] - 1] <= now -> alive[line[0] - 1] = 0; pop_head()
    :: else -> break
    od;
    if
    :: !LOCKED && (qlen == 0 || line[0] == me + 1) ->
       if
       :: qlen > 0 -> pop_head(); alive[me] = 0
       :: else -> skip
       fi;
       grant(me)
    :: else ->
       if
       :: alive[me] == 0 -> line[qlen] = me + 1; qlen++;
          printf("MSC: t=%d client %d: not free for it, joins the line (%d in line)\n", now, me, qlen)
       :: else -> skip
       fi;
       alive[me] = now + GRACE;
       waiting[me] = true
    fi
    fi
#endif
}

/* EXCLUSION: asserted as a client enters, the only step that can break it. */
inline enter(me) {
    assert(!in_cs[0] && !in_cs[1] && !in_cs[2]);
    in_cs[me] = true
}

proctype Client(byte me) {
    byte r = 0, got, t0, j;
    do
    :: r < R ->
       /* client 0 sometimes tries first (try_acquire), then waits */
       if
       :: me == 0 -> atomic { t0 = now; try_set(me); if :: got -> deadline[me] = t0 + TTL - DRIFT; enter(me) :: else -> skip fi }
       :: skip
       fi;
       do
       :: in_cs[me] -> break
       :: !in_cs[me] -> atomic {
              t0 = now; acquire(me);
              if
              :: got -> deadline[me] = t0 + TTL - DRIFT; enter(me); break
              :: else -> skip
              fi
          }
       od;
       atomic {
           in_cs[me] = false;
#ifndef PLAIN
           if
           :: alive[me] != 0 -> alive[me] = 0; leave_line(me)
           :: else -> skip
           fi;
#endif
           if
           :: holder == me + 1 && now < lock_exp ->
#ifdef PLAIN
              holder = 0;
#else
              /* hand over to the first live waiter of the line, else delete */
              holder = 0;
              do
              :: qlen > 0 && alive[line[0] - 1] > now ->
                 holder = line[0]; lock_exp = now + GRACE; pop_head(); break
              :: qlen > 0 && alive[line[0] - 1] <= now -> alive[line[0] - 1] = 0; pop_head()
              :: else -> break
              od;
#endif
              if
              :: holder > 0 -> printf("MSC: t=%d client %d: releases, hands the lock to client %d\n", now, me, holder - 1)
              :: else -> printf("MSC: t=%d client %d: releases\n", now, me)
              fi
           :: else -> skip
           fi
       }
       r++
    :: else -> break
    od
}

/* Time passes unless a holder would outlive its validity or a waiter its grace. */
#define OK_TO_TICK(c) ((!in_cs[c] || now + 1 < deadline[c]) && (!waiting[c] || alive[c] > now + 1))

proctype Clock() {
end_clock:
    do
    :: atomic { now < MAXT && OK_TO_TICK(0) && OK_TO_TICK(1) && OK_TO_TICK(2) -> now++ }
    od
}


init {
    atomic {
        run Clock();
        run Client(0);
        run Client(1);
        run Client(2)
    }
}
