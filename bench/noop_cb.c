/* A CUPTI callback that returns at once, for bench/cupti_costs.py's "launch callbacks
 * only" set-up (what CUPTI's dispatch costs a launch, without zcta's own callback).
 * Build: cc -O2 -shared -fPIC -o .carry/libnoop_cb.so bench/noop_cb.c */
void noop_cb(void *user, int domain, unsigned cbid, const void *data) {
  (void)user;
  (void)domain;
  (void)cbid;
  (void)data;
}
