/* One lock + a fenced resource.
 *
 * The lock grants leases one at a time; each grant gets the next token (strictly increasing per
 * key, as every leasehold backend that claims fencing does). A grant can end at any moment
 * (expiry, a lost session): the lock then grants the next one. Clients are never told in time: a
 * client keeps sending writes under a grant it lost (a paused process, a delayed packet). The
 * network between clients and the resource delays and reorders messages arbitrarily: a message
 * sits in one of NET slots until the resource takes any one of them.
 *
 * Two resources, chosen at compile time:
 *   FENCED  the resource keeps the highest token it accepted and rejects a lower one (what
 *           leasehold's FenceLayer and the fence stores do);
 *   RANDOM  the resource knows only random owner values: a holder announces its value when
 *           granted ("claim"), and a write is accepted when its value equals the last announced
 *           one, as a compare-and-set on a random version would. Values carry no order.
 * Every write also carries its grant's token as a ghost, so that both resources are judged by the
 * same properties:
 *   ORDER   the resource never accepts a write whose token is lower than one it accepted before;
 *   GRANTED every accepted token was granted by the lock.
 * STALE (optional, -DCHECK_STALE) asserts that a write from a holder whose grant has ended is
 * never accepted; fencing does NOT promise this (an old holder's write is accepted until a newer
 * holder has written), and the search is expected to find the counterexample.
 *
 * Bounds: CLIENTS clients, GRANTS grants in all, WRITES writes per grant, NET in-flight slots.
 */
#ifndef CLIENTS
#define CLIENTS 2
#endif
#ifndef GRANTS
#define GRANTS 3
#endif
#ifndef WRITES
#define WRITES 2
#endif
#ifndef NET
#define NET 3
#endif

#define CLAIM 1
#define WRITE 2

byte counter = 0;              /* last token minted by the lock */
byte holder = 255;             /* client holding the current grant, 255 = none */
bool granted[GRANTS + 1];      /* granted[t]: token t was handed out */

/* The network: kind, client, token (the owner value of grant t is "t" too: unique, unordered
 * for the RANDOM resource, which only ever compares values for equality). */
byte net_kind[NET];
byte net_client[NET];
byte net_token[NET];

byte accepted_max = 0;         /* ghost: highest token of an accepted write */
byte version = 0;              /* RANDOM: the owner value last announced */

inline send(k, c, t) {
    /* blocks while the network is full: a bounded model of "in flight" */
    atomic {
        if
        :: net_kind[0] == 0 -> net_client[0] = c; net_token[0] = t; net_kind[0] = k
        :: net_kind[1] == 0 -> net_client[1] = c; net_token[1] = t; net_kind[1] = k
        :: net_kind[2] == 0 -> net_client[2] = c; net_token[2] = t; net_kind[2] = k
        fi
    }
}

proctype Client(byte me) {
    byte mine = 0, w;
    do
    :: atomic { holder == 255 && counter < GRANTS ->
           counter++; holder = me; mine = counter; granted[mine] = true;
           printf("MSC: lock -> client %d: granted, token %d\n", me, mine) }
#ifdef RANDOM
       send(CLAIM, me, mine);
       printf("MSC: client %d -> resource: claim value v%d (sent)\n", me, mine);
#endif
       w = 0;
       do
       :: w < WRITES -> send(WRITE, me, mine);
          printf("MSC: client %d -> resource: write with token %d (sent)\n", me, mine);
          w++
       :: break
       od;
       /* release, if the grant is still ours; or it was lost long ago */
       atomic { if :: holder == me -> holder = 255 :: else -> skip fi }
    :: counter >= GRANTS -> break
    od
}

/* Expiry and lost sessions: the lock ends the current grant at any moment. */
proctype Expiry() {
end_expiry:
    do
    :: atomic { holder != 255 -> printf("MSC: lock: grant of client %d ends (expired)\n", holder); holder = 255 }
    :: counter >= GRANTS -> break
    od
}

proctype Resource() {
    byte i, k, c, t;
end_resource:
    do
    :: atomic {
        if
        :: net_kind[0] != 0 -> i = 0
        :: net_kind[1] != 0 -> i = 1
        :: net_kind[2] != 0 -> i = 2
        fi;
        k = net_kind[i]; c = net_client[i]; t = net_token[i]; net_kind[i] = 0;
        if
        :: k == CLAIM -> version = t;
           printf("MSC: resource <- client %d: claim v%d (current value now v%d)\n", c, t, t)
        :: k == WRITE ->
#ifdef RANDOM
           if
           :: t == version -> goto take
           :: else -> printf("MSC: resource <- client %d: write (value v%d) rejected\n", c, t)
           fi
#else
           if
           :: t >= accepted_max -> goto take
           :: else -> printf("MSC: resource <- client %d: write with token %d rejected (seen %d)\n", c, t, accepted_max)
           fi
#endif
           ; goto done;
take:
           printf("MSC: resource <- client %d: write with token %d ACCEPTED\n", c, t);
           assert(t >= accepted_max);      /* ORDER */
           assert(granted[t]);             /* GRANTED */
#ifdef CHECK_STALE
           assert(holder == c && t == counter); /* STALE: not promised */
#endif
           accepted_max = t;
done:      skip
        fi
       }
    od
}

init {
    atomic {
        byte c = 0;
        do
        :: c < CLIENTS -> run Client(c); c++
        :: else -> break
        od;
        run Expiry();
        run Resource()
    }
}
