// Choosing the interface to listen on (transport/base/sock.c): the
// WEFT_SOCKET_IFNAME matcher in NCCL's syntax, the default choice over a made-up
// list of interfaces, the choice on this host's own interfaces, IPv6 addresses
// in brackets, and connect errors that say why.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstring>
#include <ostream>
#include <string>
#include <vector>

#include "bootstrap_probe.h"

extern "C" {
#include "collectives/api/config.h"
#include "transport/base/peer_info.h"
#include "transport/base/sock.h"
#include "transport/base/status.h"
#include "transport/base/wait.h"
#include "transport/bootstrap/bootstrap.h"
#include "transport/bootstrap/wire.h"
}

namespace {

// --- the matcher ------------------------------------------------------------

struct MatchCase {
  const char *list;  // nullptr: unset
  const char *name;
  bool allowed;
};

void PrintTo(const MatchCase &c, std::ostream *os) {
  *os << "\"" << (c.list ? c.list : "(unset)") << "\" " << c.name;
}

class IfnameMatch : public testing::TestWithParam<MatchCase> {};

TEST_P(IfnameMatch, AllowsWhatTheListSays) {
  const MatchCase &c = GetParam();
  EXPECT_EQ(sock_ifname_match(c.list, c.name) != 0, c.allowed)
      << "list \"" << (c.list ? c.list : "(unset)") << "\", name " << c.name;
}

const MatchCase kMatchCases[] = {
    // prefixes, one or a list
    {"eth", "eth0", true},
    {"eth", "eth10", true},
    {"eth", "et", false},
    {"eth", "enp1s0", false},
    {"eth0", "eth0", true},
    {"eth0", "eth01", true},
    {"eth,ib", "eth1", true},
    {"eth,ib", "ib0", true},
    {"eth,ib", "lo", false},
    {"eth,ib", "enp1s0", false},
    // '^': every name but the listed ones
    {"^lo", "lo", false},
    {"^lo", "eth0", true},
    {"^docker,lo", "docker0", false},
    {"^docker,lo", "lo", false},
    {"^docker,lo", "eth0", true},
    {"^docker,lo", "ib0", true},
    // '=': whole names
    {"=eth0", "eth0", true},
    {"=eth0", "eth01", false},
    {"=eth0", "eth", false},
    {"=eth0,ib0", "ib0", true},
    {"=eth0,ib0", "ib1", false},
    // '^=': every name but the listed whole names
    {"^=docker0", "docker0", false},
    {"^=docker0", "docker01", true},
    {"^=docker0", "eth0", true},
    // empty items name nothing: they do not match every name
    {"eth,,ib", "ib0", true},
    {"eth,,ib", "lo", false},
    {",eth,", "eth0", true},
    {",eth,", "lo", false},
    {"^,lo,", "lo", false},
    {"^,lo,", "eth0", true},
    // a list that names nothing allows every name, as an unset one does
    {nullptr, "eth0", true},
    {"", "eth0", true},
    {"^", "lo", true},
    {"=", "lo", true},
    {",", "lo", true},
};

INSTANTIATE_TEST_SUITE_P(Sock, IfnameMatch, testing::ValuesIn(kMatchCases));

// --- the choice over a list of interfaces -------------------------------------

constexpr unsigned kRunning = IFF_UP | IFF_RUNNING;
constexpr unsigned kLoopback = IFF_UP | IFF_RUNNING | IFF_LOOPBACK;

sock_if v4(const char *name, unsigned flags, const char *ip) {
  sock_if i;
  memset(&i, 0, sizeof i);
  i.name = name;
  i.flags = flags;
  i.addr.in.sin_family = AF_INET;
  EXPECT_EQ(inet_pton(AF_INET, ip, &i.addr.in.sin_addr), 1) << ip;
  return i;
}

sock_if v6(const char *name, unsigned flags, const char *ip) {
  sock_if i;
  memset(&i, 0, sizeof i);
  i.name = name;
  i.flags = flags;
  i.addr.in6.sin6_family = AF_INET6;
  EXPECT_EQ(inet_pton(AF_INET6, ip, &i.addr.in6.sin6_addr), 1) << ip;
  return i;
}

// An entry without an address (getifaddrs lists one per interface, for its
// link-layer address).
sock_if noaddr(const char *name, unsigned flags) {
  sock_if i;
  memset(&i, 0, sizeof i);
  i.name = name;
  i.flags = flags;
  i.addr.sa.sa_family = AF_PACKET;
  return i;
}

// "name ip" of the chosen entry, "none" when there is none.
std::string choose(const std::vector<sock_if> &ifs, const char *list = nullptr) {
  int k = sock_if_choose(ifs.data(), (int)ifs.size(), list);
  if (k < 0) return "none";
  EXPECT_LT(k, (int)ifs.size());
  char buf[64];
  return std::string(ifs[k].name) + " " + sock_addr_str(&ifs[k].addr, buf, sizeof buf);
}

TEST(SockIfChoose, SkipsLoopbackAndDocker) {
  std::vector<sock_if> ifs = {noaddr("lo", kLoopback), v4("lo", kLoopback, "127.0.0.1"),
                              v4("docker0", kRunning, "172.17.0.1"),
                              v4("eth0", kRunning, "10.0.0.5")};
  EXPECT_EQ(choose(ifs), "eth0 10.0.0.5:0");
}

TEST(SockIfChoose, SkipsAnInterfaceWithoutCarrier) {
  std::vector<sock_if> ifs = {v4("lo", kLoopback, "127.0.0.1"),
                              v4("br0", IFF_UP, "172.18.0.1"),  // up, no carrier
                              v4("eth0", kRunning, "10.0.0.5")};
  EXPECT_EQ(choose(ifs), "eth0 10.0.0.5:0");
}

TEST(SockIfChoose, IPv6WhenThereIsNoIPv4) {
  std::vector<sock_if> ifs = {v4("lo", kLoopback, "127.0.0.1"), v6("lo", kLoopback, "::1"),
                              v6("eth0", kRunning, "fe80::1"),  // link-local: skipped
                              v6("eth0", kRunning, "fd77::1")};
  EXPECT_EQ(choose(ifs), "eth0 [fd77::1]:0");
}

TEST(SockIfChoose, IPv4BeforeIPv6) {
  std::vector<sock_if> ifs = {v6("eth0", kRunning, "fd77::1"), v4("eth0", kRunning, "10.0.0.5")};
  EXPECT_EQ(choose(ifs), "eth0 10.0.0.5:0");
  // an interface's IPv6 address beats docker's IPv4 one, which reaches only containers
  ifs = {v4("docker0", kRunning, "172.17.0.1"), v6("eth0", kRunning, "fd77::1")};
  EXPECT_EQ(choose(ifs), "eth0 [fd77::1]:0");
}

TEST(SockIfChoose, TheFirstOfEqualOnes) {
  std::vector<sock_if> ifs = {v4("eth1", kRunning, "10.0.1.5"), v4("eth0", kRunning, "10.0.0.5")};
  EXPECT_EQ(choose(ifs), "eth1 10.0.1.5:0");
}

TEST(SockIfChoose, LoopbackAndDockerOnlyWhenNothingElse) {
  std::vector<sock_if> ifs = {v4("lo", kLoopback, "127.0.0.1"),
                              v4("docker0", kRunning, "172.17.0.1")};
  EXPECT_EQ(choose(ifs), "docker0 172.17.0.1:0");
  ifs = {v4("lo", kLoopback, "127.0.0.1"), v4("docker0", IFF_UP, "172.17.0.1")};
  EXPECT_EQ(choose(ifs), "docker0 172.17.0.1:0");
  ifs = {v6("lo", kLoopback, "::1"), v4("lo", kLoopback, "127.0.0.1"),
         v4("eth0", IFF_RUNNING, "10.0.0.5")};  // down
  EXPECT_EQ(choose(ifs), "lo 127.0.0.1:0");
  ifs = {v6("lo", kLoopback, "::1")};
  EXPECT_EQ(choose(ifs), "lo [::1]:0");
  ifs = {noaddr("eth0", kRunning), v6("eth0", kRunning, "fe80::1")};
  EXPECT_EQ(choose(ifs), "none");
  EXPECT_EQ(choose({}), "none");
}

TEST(SockIfChoose, TheListRestrictsTheChoice) {
  std::vector<sock_if> ifs = {v4("lo", kLoopback, "127.0.0.1"),
                              v4("docker0", IFF_UP, "172.17.0.1"),
                              v4("eth0", kRunning, "10.0.0.5"), v4("eth1", kRunning, "10.0.1.5"),
                              v6("ib0", kRunning, "fd77::1")};
  EXPECT_EQ(choose(ifs, "=lo"), "lo 127.0.0.1:0");
  EXPECT_EQ(choose(ifs, "^lo"), "eth0 10.0.0.5:0");
  EXPECT_EQ(choose(ifs, "^eth0,lo"), "eth1 10.0.1.5:0");
  EXPECT_EQ(choose(ifs, "^=eth0"), "eth1 10.0.1.5:0");
  EXPECT_EQ(choose(ifs, "ib,eth"), "eth0 10.0.0.5:0");  // IPv4 first, not the list's order
  EXPECT_EQ(choose(ifs, "ib"), "ib0 [fd77::1]:0");
  EXPECT_EQ(choose(ifs, "docker"), "docker0 172.17.0.1:0");  // named: taken without carrier
  EXPECT_EQ(choose(ifs, "^eth,ib,docker"), "lo 127.0.0.1:0");
  EXPECT_EQ(choose(ifs, "=eth"), "none");
  EXPECT_EQ(choose(ifs, "wlan"), "none");
  EXPECT_EQ(choose(ifs, "^"), "eth0 10.0.0.5:0");  // names nothing: as unset
}

// --- this host ----------------------------------------------------------------

// Sets WEFT_SOCKET_IFNAME (nullptr: unsets it) for the scope, re-reading the
// settings.
struct IfnameEnv {
  explicit IfnameEnv(const char *value) {
    if (value != nullptr) setenv("WEFT_SOCKET_IFNAME", value, 1);
    else unsetenv("WEFT_SOCKET_IFNAME");
    weft_params_reset();
  }
  ~IfnameEnv() {
    unsetenv("WEFT_SOCKET_IFNAME");
    weft_params_reset();
  }
};

// Whether an interface other than loopback is up with an address to listen on.
bool have_other_interface() {
  struct ifaddrs *all = nullptr;
  if (getifaddrs(&all) != 0) return false;
  bool found = false;
  for (struct ifaddrs *i = all; i != nullptr && !found; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || !(i->ifa_flags & IFF_UP) || (i->ifa_flags & IFF_LOOPBACK))
      continue;
    if (i->ifa_addr->sa_family == AF_INET) found = true;
    if (i->ifa_addr->sa_family == AF_INET6 &&
        !IN6_IS_ADDR_LINKLOCAL(&((struct sockaddr_in6 *)i->ifa_addr)->sin6_addr))
      found = true;
  }
  freeifaddrs(all);
  return found;
}

// Listens on addr and connects to the listener: the address is usable.
void expect_usable(const union weft_sockaddr &addr) {
  int lfd = -1, cfd = -1, afd = -1;
  union weft_sockaddr bound;
  ASSERT_EQ(sock_listen(&addr, &lfd, &bound), weftSuccess) << weft_error_text();
  uint64_t deadline = clock_ns() + 5000000000ull;
  ASSERT_EQ(sock_connect(&bound, deadline, &cfd), weftSuccess) << weft_error_text();
  ASSERT_EQ(sock_accept(lfd, deadline, nullptr, &afd), weftSuccess) << weft_error_text();
  char x = 'x', y = 0;
  EXPECT_EQ(sock_send_all(cfd, &x, 1, deadline), weftSuccess);
  EXPECT_EQ(sock_recv_all(afd, &y, 1, deadline), weftSuccess);
  EXPECT_EQ(y, 'x');
  close(afd);
  close(cfd);
  close(lfd);
}

// ^lo where this host has another interface, =lo where it has only loopback.
TEST(SockLocalAddr, ResolvesWithAnIfnameList) {
  bool other = have_other_interface();
  IfnameEnv env(other ? "^lo" : "=lo");
  union weft_sockaddr addr;
  ASSERT_EQ(sock_local_addr(&addr), weftSuccess) << weft_error_text();
  char buf[64];
  EXPECT_EQ(sock_addr_is_loopback(&addr) != 0, !other) << sock_addr_str(&addr, buf, sizeof buf);
  expect_usable(addr);
  // the route to a peer is not asked when the list is set
  union weft_sockaddr to;
  ASSERT_EQ(sock_local_addr_to(&addr, &to), weftSuccess) << weft_error_text();
  EXPECT_EQ(memcmp(&to, &addr, sizeof to), 0) << sock_addr_str(&to, buf, sizeof buf);
}

TEST(SockLocalAddr, ExactLoopbackName) {
  struct ifaddrs *all = nullptr;
  ASSERT_EQ(getifaddrs(&all), 0);
  std::string lo;
  for (struct ifaddrs *i = all; i != nullptr && lo.empty(); i = i->ifa_next)
    if ((i->ifa_flags & IFF_LOOPBACK) && (i->ifa_flags & IFF_UP)) lo = i->ifa_name;
  freeifaddrs(all);
  if (lo.empty()) GTEST_SKIP() << "no loopback interface up";
  IfnameEnv env(("=" + lo).c_str());
  union weft_sockaddr addr;
  ASSERT_EQ(sock_local_addr(&addr), weftSuccess) << weft_error_text();
  EXPECT_TRUE(sock_addr_is_loopback(&addr));
  expect_usable(addr);
}

TEST(SockLocalAddr, AListThatAllowsNothingSaysWhatIsUp) {
  IfnameEnv env("=no-such-interface0,^x");
  union weft_sockaddr addr;
  EXPECT_EQ(sock_local_addr(&addr), weftInvalidArgument);
  std::string text = weft_error_text();
  EXPECT_NE(text.find("WEFT_SOCKET_IFNAME==no-such-interface0,^x"), std::string::npos) << text;
  EXPECT_NE(text.find("(up: "), std::string::npos) << text;
}

// --- addresses in text ----------------------------------------------------------

TEST(SockAddrStr, IPv6InBrackets) {
  sock_if a = v6("x", 0, "fd77::1");
  a.addr.in6.sin6_port = htons(29590);
  char buf[64];
  EXPECT_STREQ(sock_addr_str(&a.addr, buf, sizeof buf), "[fd77::1]:29590");
  sock_if b = v4("x", 0, "10.77.0.1");
  b.addr.in.sin_port = htons(29590);
  EXPECT_STREQ(sock_addr_str(&b.addr, buf, sizeof buf), "10.77.0.1:29590");
  // a long IPv6 address and port fit the 64 bytes callers give
  sock_if c = v6("x", 0, "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff");
  c.addr.in6.sin6_port = htons(65535);
  EXPECT_STREQ(sock_addr_str(&c.addr, buf, sizeof buf),
               "[ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff]:65535");
}

// What sock_addr_str prints is what WEFT_COMM_ID takes back.
TEST(SockAddrStr, ReadBackAsACommId) {
  sock_if a = v6("x", 0, "::1");
  a.addr.in6.sin6_port = htons(29590);
  char buf[64];
  bootstrap_id id;
  ASSERT_EQ(bootstrap_id_from_hostport(sock_addr_str(&a.addr, buf, sizeof buf), "WEFT_COMM_ID",
                                       &id),
            weftSuccess)
      << weft_error_text();
  ASSERT_EQ(id.root.sa.sa_family, AF_INET6);
  EXPECT_EQ(memcmp(&id.root.in6.sin6_addr, &a.addr.in6.sin6_addr, sizeof(in6_addr)), 0);
  EXPECT_EQ(ntohs(id.root.in6.sin6_port), 29590);
}

// --- connect errors ---------------------------------------------------------------

// A port on addr that nothing listens on (bound, never listened, then closed).
union weft_sockaddr closed_port(union weft_sockaddr addr) {
  int lfd = -1;
  union weft_sockaddr bound;
  EXPECT_EQ(sock_listen(&addr, &lfd, &bound), weftSuccess) << weft_error_text();
  close(lfd);
  return bound;
}

// A unique id whose root is at addr, made by a process that is not there.
std::string join_root_at(const union weft_sockaddr &addr) {
  bootstrap_id id;
  memset(&id, 0, sizeof id);
  id.magic = BOOTSTRAP_MAGIC;
  id.root = addr;
  peer_info self;
  memset(&self, 0, sizeof self);
  bootstrap_peer_info_local(&self);
  self.cuda_dev = -1;
  peer_info peers[2];
  bootstrap *bs = nullptr;
  EXPECT_NE(bootstrap_init(&id, 0, 2, &self, 500000000ull, &bs, peers), weftSuccess);
  return weft_error_text();
}

TEST(SockConnect, RefusedSaysTheRootHasExited) {
  union weft_sockaddr any;
  memset(&any, 0, sizeof any);
  IfnameEnv env(nullptr);
  ASSERT_EQ(sock_local_addr(&any), weftSuccess) << weft_error_text();
  if (sock_addr_is_loopback(&any)) GTEST_SKIP() << "no interface but loopback";
  union weft_sockaddr at = closed_port(any);
  int fd = -1, err = 0;
  EXPECT_EQ(sock_connect_peer_errno(&at, clock_ns() + 2000000000ull, nullptr, &fd, &err),
            weftRemoteError);
  EXPECT_EQ(err, ECONNREFUSED);
  std::string text = join_root_at(at);
  EXPECT_NE(text.find("the process that made the unique id has exited"), std::string::npos)
      << text;
  EXPECT_EQ(text.find("not reachable"), std::string::npos) << text;
}

TEST(SockConnect, RefusedOnLoopbackSaysSo) {
  union weft_sockaddr lo;
  memset(&lo, 0, sizeof lo);
  lo.in.sin_family = AF_INET;
  lo.in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string text = join_root_at(closed_port(lo));
  EXPECT_NE(text.find("Connection refused"), std::string::npos) << text;
  EXPECT_NE(text.find("names a loopback address"), std::string::npos) << text;
}

TEST(SockConnect, UnreachableSaysSoAndNamesIfname) {
  union weft_sockaddr far;
  memset(&far, 0, sizeof far);
  far.in.sin_family = AF_INET;
  far.in.sin_addr.s_addr = htonl(INADDR_BROADCAST);  // TCP never reaches it
  far.in.sin_port = htons(9);
  int fd = -1, err = 0;
  EXPECT_EQ(sock_connect_peer_errno(&far, clock_ns() + 200000000ull, nullptr, &fd, &err),
            weftRemoteError);
  if (err != ENETUNREACH && err != EHOSTUNREACH)
    GTEST_SKIP() << "connecting to the broadcast address failed with " << strerror(err);
  std::string text = join_root_at(far);
  EXPECT_NE(text.find("not reachable from this host"), std::string::npos) << text;
  EXPECT_NE(text.find("WEFT_SOCKET_IFNAME"), std::string::npos) << text;
  EXPECT_EQ(text.find("has exited"), std::string::npos) << text;
}

// Connections made at once: an address that leads nowhere does not hold up
// the ones after it; a listener is connected, a closed port refused at once.
TEST(SockConnectMany, ASilentAddressHoldsUpNoOther) {
  union weft_sockaddr nowhere, listening, closed;
  std::vector<int> held;
  ASSERT_TRUE(weft_test::silent_listener(&nowhere, &held)) << "no listener that answers nothing";
  union weft_sockaddr lo;
  memset(&lo, 0, sizeof lo);
  lo.in.sin_family = AF_INET;
  lo.in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int lfd = -1, cfd = -1;
  ASSERT_EQ(sock_listen(&lo, &lfd, &listening), weftSuccess);
  ASSERT_EQ(sock_listen(&lo, &cfd, &closed), weftSuccess);
  close(cfd); /* nothing listens there now */
  const union weft_sockaddr *addrs[4] = {&nowhere, &listening, nullptr, &closed};
  int fds[4], errs[4];
  const uint64_t t0 = clock_ns();
  sock_connect_many(addrs, 4, t0 + 1500000000ull, fds, errs, nullptr, nullptr);
  const double took = (double)(clock_ns() - t0) / 1e9;
  printf("nowhere: fd %d errno %d (%s); listener: fd %d; closed: errno %d; %.2f s\n", fds[0],
         errs[0], strerror(errs[0]), fds[1], errs[3], took);
  EXPECT_LT(fds[0], 0);
  EXPECT_NE(errs[0], 0);
  EXPECT_GE(fds[1], 0);
  EXPECT_EQ(errs[1], 0);
  EXPECT_EQ(fds[2], -1); /* skipped */
  EXPECT_EQ(errs[2], 0);
  EXPECT_LT(fds[3], 0);
  EXPECT_EQ(errs[3], ECONNREFUSED);
  EXPECT_LT(took, 3.0);
  if (fds[1] >= 0) close(fds[1]);
  close(lfd);
  for (int fd : held) close(fd);
}

}  // namespace
