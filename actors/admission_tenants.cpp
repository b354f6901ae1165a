// The admission actor's tenants: constant-time token checks, authentication, and the open-tenant
// table whose idle unknown tenants are forgotten.
#include <algorithm>
#include <string>

#include "actors/admission_state.hpp"
#include "core/wire.hpp"

namespace sy {

bool tokens_equal(std::string_view a, std::string_view b) {
  // Every byte position up to the longer length is visited and differences are OR-ed, so the
  // time does not reveal the length of a matching prefix.
  const std::size_t n = std::max(a.size(), b.size());
  volatile unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (std::size_t i = 0; i < n; ++i) {
    unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff = diff | static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

namespace admission_detail {

TenantState* authenticate(Self* self, const std::string& tenant, const std::string& token,
                          bool internal, std::string& why) {
  auto& st = self->state;
  auto i = st.tenants.find(tenant);
  if (i == st.tenants.end()) {
    if (!st.anonymous) {
      why = "unknown tenant " + wire::quoted(tenant);
      return nullptr;
    }
    // Anonymous mode: every tenant name is its own unlimited tenant of weight 1.
    auto now_ms = clock_us(self) / 1000;
    i = st.tenants.emplace(tenant, TenantState{"", 1.0, policy::TenantQuota(0, 0, 0, now_ms)})
            .first;
  }
  if (!internal && !i->second.token.empty() && !tokens_equal(i->second.token, token)) {
    why = "wrong token for tenant " + wire::quoted(tenant);
    return nullptr;
  }
  return &i->second;
}

namespace {

/// Forgets idle unknown tenants: those idle for cfg.tenant_idle_ms, and the longest idle beyond
/// cfg.max_idle_tenants. One whose token bucket is still refilling is kept (forgetting it would
/// hand it a full bucket early); unknown tenants have unlimited buckets, so this is for safety.
void forget_idle_tenants(Self* self, int64_t now_ms) {
  auto& st = self->state;
  std::size_t refilling = 0;  // moved to the back this time: each is looked at once at most
  while (!st.idle.empty()) {
    auto t = st.tenants.find(st.idle.front());
    if (t == st.tenants.end()) {  // cannot happen: every entry of `idle` names a tenant
      st.idle.pop_front();
      continue;
    }
    TenantState& ts = t->second;
    const bool over = st.idle.size() > st.cfg.max_idle_tenants;
    if (!over && now_ms - ts.idle_since_ms < st.cfg.tenant_idle_ms) break;  // the rest are younger
    auto& b = ts.quota.bucket();
    if (!b.unlimited() && b.level(now_ms) < b.burst()) {
      // Look again once it could be full; meanwhile the next one may go.
      st.idle.splice(st.idle.end(), st.idle, ts.idle_at);
      ts.idle_since_ms = now_ms;
      if (!over || ++refilling >= st.idle.size()) break;
      continue;
    }
    st.idle.pop_front();
    st.tenants.erase(t);
    ++st.tenants_forgotten;
  }
}

}  // namespace

void settle_tenant(Self* self, const std::string& name) {
  auto& st = self->state;
  const int64_t now_ms = clock_us(self) / 1000;
  auto t = st.tenants.find(name);
  if (t != st.tenants.end() && !t->second.configured) {
    TenantState& ts = t->second;
    if (ts.idle) st.idle.erase(ts.idle_at);
    ts.idle = ts.quota.in_flight().current() == 0;
    if (ts.idle) {
      ts.idle_at = st.idle.insert(st.idle.end(), name);
      ts.idle_since_ms = now_ms;
    }
  }
  forget_idle_tenants(self, now_ms);
}

}  // namespace admission_detail
}  // namespace sy
