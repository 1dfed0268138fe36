// MINPACK's hybrj (Powell's hybrid method with a user Jacobian), the form SciPy's
// root(method="hybr") runs, split at its calls of the user's function so that a JAX
// program can evaluate the function and the Jacobian in between (reverse
// communication). Pure math on raw pointers: no XLA headers.
//
// The routines enorm, dogleg, qrfac, qform, r1updt and r1mpyq are SciPy's C translation
// of MINPACK (scipy/optimize/src/minpack.c, SciPy 1.17, BSD-3-Clause), kept line for line
// so that the iterates are SciPy's to the bit. MINPACK itself: Argonne National
// Laboratory, MINPACK project, March 1980, B. S. Garbow, K. E. Hillstrom, J. J. More
// (the Minpack Copyright Notice (1999) University of Chicago: redistribution with this
// acknowledgment). Both licences: THIRD_PARTY_NOTICES.md at the repository root.
#ifndef JAXBRIDGE_MATH_MINPACK_HYBRJ_H_
#define JAXBRIDGE_MATH_MINPACK_HYBRJ_H_

#include <cmath>
#include <cstdint>
#include <vector>

namespace jaxbridge::minpack {

constexpr double kEpsmch = 2.220446049250313e-16;   // MINPACK's dpmpar(1)
constexpr double kGiant = 1.7976931348623157e+308;  // dpmpar(3)

// ---------------------------------------------------------------- SciPy's routines
inline double enorm(const int n, const double* x)
{
    int i;
    double agiant, s1, s2, s3, xabs, x1max, x3max;
    const double rgiant = std::pow(2.0, 63.5);
    const double rdwarf = 0.5 / rgiant;
    s1 = 0.0;
    s2 = 0.0;
    s3 = 0.0;
    x1max = 0.0;
    x3max = 0.0;
    agiant = rgiant / n;
    for (i = 0; i < n; i++)
    {
        xabs = std::fabs(x[i]);
        if ((xabs <= rdwarf) || (xabs >= agiant))
        {
            if (xabs > rdwarf)
            {
                if (xabs > x1max)
                {
                    s1 = 1.0 + s1*std::pow(x1max / xabs, 2.0);
                    x1max = xabs;
                } else {
                    s1 += std::pow(xabs / x1max, 2.0);
                }
            } else {
                if (xabs > x3max)
                {
                    s3 = 1.0 + s3*std::pow(x3max / xabs, 2.0);
                    x3max = xabs;
                } else {
                    if (xabs != 0.0)
                    {
                        s3 += std::pow(xabs / x3max, 2.0);
                    }
                }
            }
        } else {
            s2 += xabs*xabs;
        }
    }
    if (s1 != 0.0)
    {
        return x1max*std::sqrt(s1+(s2/x1max)/x1max);
    }
    if (s2 != 0.0)
    {
        if (s2 >= x3max)
        {
            return std::sqrt(s2*(1.0 + (x3max/s2)*(x3max*s3)));
        } else {
            return std::sqrt(x3max*((s2/x3max)+(x3max*s3)));
        }
    }
    return x3max*std::sqrt(s3);
}

inline void dogleg(const int n, const double* r, const double* diag, const double* qtb,
            const double* delta, double* x, double* wa1, double* wa2)
{
    int i, j, jj, k, l;
    double alpha, bnorm, epsmch, gnorm, qnorm, sgnorm, ssum, temp;
    epsmch = kEpsmch;
    jj = (n * (n + 1)) / 2;
    for (k = 0; k < n; k++)
    {
        j = n - k - 1;
        jj -= k + 1;
        l = jj + 1;
        ssum = 0.0;
        if (n - 1 > j)
        {
            for (i = j + 1; i < n; i++)
            {
                ssum += r[l]*x[i];
                l++;
            }
        }
        temp = r[jj];
        if (temp == 0.0)
        {
            l = j;
            for (i = 0; i <= j; i++)
            {
                temp = std::fmax(temp, std::fabs(r[l]));
                l += n - i - 1;
            }
            temp = epsmch*temp;
            if (temp == 0.0) { temp = epsmch; }
        }
        x[j] = (qtb[j] - ssum)/temp;
    }
    for (j = 0; j < n; j++)
    {
        wa1[j] = 0.0;
        wa2[j] = diag[j] * x[j];
    }
    qnorm = enorm(n, wa2);
    if (qnorm <= *delta) { return; }
    l = 0;
    for (j = 0; j < n; j++) {
        temp = qtb[j];
        for (i = j; i < n; i++) {
            wa1[i] += r[l] * temp;
            l++;
        }
        wa1[j] /= diag[j];
    }
    gnorm = enorm(n, wa1);
    sgnorm = 0.0;
    alpha = *delta / qnorm;
    if (gnorm != 0.0)
    {
        for (j = 0; j < n; j++)
        {
            wa1[j] /= gnorm;
            wa1[j] /= diag[j];
        }
        l = 0;
        for (j = 0; j < n; j++) {
            ssum = 0.0;
            for (i = j; i < n; i++) {
                ssum += r[l] * wa1[i];
                l++;
            }
            wa2[j] = ssum;
        }
        temp = enorm(n, wa2);
        sgnorm = (gnorm / temp) / temp;
        alpha = 0.0;
        if (sgnorm < *delta)
        {
            bnorm = enorm(n, qtb);
            temp = (bnorm/gnorm)*(bnorm/qnorm)*(sgnorm / *delta);
            temp = temp - (*delta / qnorm)*std::pow(sgnorm / *delta, 2.0)
                        + std::sqrt(std::pow(temp - (*delta / qnorm), 2.0)
                               + (
                                   (1.0 - std::pow(*delta / qnorm, 2.0) )
                                  *(1.0 - std::pow((sgnorm / *delta), 2.0) )
                                 )
                              );
            alpha = ( (*delta/qnorm)*(1.0 - std::pow(sgnorm / *delta, 2.0)) )/temp;
        }
    }
    temp = (1.0 - alpha)*std::fmin(sgnorm, *delta);
    for (j = 0; j < n; j++) {
        x[j] = temp*wa1[j] + alpha*x[j];
    }
    return;
}

inline void qrfac(const int m, const int n, double* a, const int lda, const int pivot,
           int* ipvt, double* rdiag, double* acnorm, double* wa)
{
    int i, j, k, kmax, minmn;
    double ajnorm, epsmch, ssum, temp;
    epsmch = kEpsmch;
    for (j = 0; j < n; j++)
    {
        acnorm[j] = enorm(m, &a[j*lda]);
        rdiag[j] = acnorm[j];
        wa[j] = rdiag[j];
        if (pivot) { ipvt[j] = j; }
    }
    minmn = (m > n ? n : m);
    for (j = 0; j < minmn; j++)
    {
        if (pivot)
        {
            kmax = j;
            for (k = j; k < n; k++)
            {
                if (rdiag[k] > rdiag[kmax]) { kmax = k; }
            }
            if (kmax != j)
            {
                for (i = 0; i < m; i++)
                {
                    temp = a[i + lda*j];
                    a[i + lda*j] = a[i + lda*kmax];
                    a[i + lda*kmax] = temp;
                }
                rdiag[kmax] = rdiag[j];
                wa[kmax] = wa[j];
                k = ipvt[j];
                ipvt[j] = ipvt[kmax];
                ipvt[kmax] = k;
            }
        }
        ajnorm = enorm(m - j, &a[lda*j + j]);
        if (ajnorm == 0.0)
        {
            rdiag[j] = -ajnorm;
            continue;
        }
        if (a[lda*j + j] < 0.0) { ajnorm = -ajnorm; }
        for (i = j; i < m; i++)
        {
            a[i + lda*j] /= ajnorm;
        }
        a[j + lda*j] += 1.0;
        if (j == n - 1)
        {
            rdiag[j] = -ajnorm;
            continue;
        }
        for (k = j+1; k < n; k++)
        {
            ssum = 0.0;
            for (i = j; i < m; i++)
            {
                ssum += a[i + lda*j]*a[i + lda*k];
            }
            temp = ssum / a[j + lda*j];
            for (i = j; i < m; i++)
            {
                a[i + lda*k] -= temp*a[i + lda*j];
            }
            if ((pivot) && (rdiag[k] != 0.0))
            {
                temp = a[j + lda*k] / rdiag[k];
                rdiag[k] *= std::sqrt(std::fmax(0.0, 1.0 - temp*temp));
                if (0.05*std::pow(rdiag[k]/wa[k], 2.0) <= epsmch)
                {
                    rdiag[k] = enorm(m-j-1, &a[(j+1) + lda*k]);
                    wa[k] = rdiag[k];
                }
            }
        }
        rdiag[j] = -ajnorm;
    }
    return;
}

inline void qform(const int m, const int n, double* q, const int ldq, double* wa)
{
    int i, j, k, l, minmn, np1;
    double ssum, temp;
    minmn = (m > n ? n : m);
    if (minmn > 1)
    {
        for (j = 1; j < minmn; j++)
        {
            for (i = 0; i < j; i++)
            {
                q[i + j*ldq] = 0.0;
            }
        }
    }
    np1 = n + 1;
    if (m >= np1)
    {
        for (j = n; j < m; j++)
        {
            for (i = 0; i < m; i++)
            {
                q[i + j*ldq] = 0.0;
            }
            q[j + j*ldq] = 1.0;
        }
    }
    for (l = 0; l < minmn; l++)
    {
        k = minmn - l - 1;
        for (i = k; i < m; i++)
        {
            wa[i] = q[i + ldq*k];
            q[i + ldq*k] = 0.0;
        }
        q[k + ldq*k] = 1.0;
        if (wa[k] != 0.0)
        {
            for (j = k; j < m; j++)
            {
                ssum = 0.0;
                for (i = k; i < m; i++)
                {
                    ssum += q[i + ldq*j]*wa[i];
                }
                temp = ssum / wa[k];
                for (i = k; i < m; i++)
                {
                    q[i + ldq*j] -= temp*wa[i];
                }
            }
        }
    }
    return;
}

inline void r1updt(const int m, const int n, double* s, const double* u, double* v,
            double* w, int* sing)
{
    int i, j, jj, l, nmj, nm1;
    double ccos, ccotan, giant, ssin, ttan, tau, temp;
    giant = kGiant;
    jj = (n*(2*m - n + 1))/2 - (m - n);
    l = jj;
    for (i = n; i <= m; i++) {
        w[i - 1] = s[l - 1];
        l++;
    }
    nm1 = n - 1;
    if (nm1 >= 1)
    {
        for (nmj = 1; nmj <= nm1; nmj++) {
            j = n - nmj;
            jj -= m - j + 1;
            w[j-1] = 0.0;
            if (v[j-1] != 0.0)
            {
                if (std::fabs(v[n-1]) < std::fabs(v[j-1]))
                {
                    ccotan = v[n-1]/v[j-1];
                    ssin = 0.5 / std::sqrt(0.25 + 0.25*(ccotan*ccotan));
                    ccos = ssin*ccotan;
                    tau = 1.0;
                    if (std::fabs(ccos)*giant > 1.0) { tau = 1.0/ccos; }
                } else {
                    ttan = v[j-1] / v[n-1];
                    ccos = 0.5 / std::sqrt(0.25 + 0.25*(ttan*ttan));
                    ssin = ccos*ttan;
                    tau = ssin;
                }
                v[n-1] = ssin*v[j-1] + ccos*v[n-1];
                v[j-1] = tau;
                l = jj;
                for (i = j; i <= m; i++) {
                    temp = ccos * s[l-1] - ssin * w[i-1];
                    w[i-1] = ssin * s[l-1] + ccos * w[i-1];
                    s[l-1] = temp;
                    l++;
                }
            }
        }
    }
    for (i = 0; i < m; i++)
    {
        w[i] += v[n-1] * u[i];
    }
    *sing = 0;
    if (nm1 >= 1) {
        for (j = 1; j <= nm1; j++) {
            if (w[j-1] != 0.) {
                if (std::fabs(s[jj-1]) < std::fabs(w[j-1])) {
                    ccotan = s[jj-1] / w[j-1];
                    ssin = 0.5 / std::sqrt(0.25 + 0.25*std::pow(ccotan, 2.0));
                    ccos = ssin * ccotan;
                    tau = 1.0;
                    if (std::fabs(ccos)*giant > 1.0) { tau = 1 / ccos; }
                } else {
                    ttan = w[j-1] / s[jj-1];
                    ccos = 0.5 / std::sqrt(0.25 + 0.25*std::pow(ttan, 2.0));
                    ssin = ccos * ttan;
                    tau = ssin;
                }
                l = jj;
                for (i = j; i <= m; i++) {
                    temp = ccos*s[l-1] + ssin*w[i-1];
                    w[i-1] = -ssin*s[l-1] + ccos*w[i-1];
                    s[l-1] = temp;
                    l++;
                }
                w[j-1] = tau;
            }
            if (s[jj-1] == 0.0)
            {
                *sing = 1;
            }
            jj += (m - j + 1);
        }
    }
    l = jj;
    for (i = n; i <= m; i++) {
        s[l-1] = w[i-1];
        l++;
    }
    if (s[jj-1] == 0.) {
    *sing = 1;
    }
    return;
}

inline void r1mpyq(const int m, const int n, double* a, const int lda, const double* v,
            const double* w)
{
    int i, j, k;
    double ccos, ssin, temp;
    if (n < 2) { return; }
    for (k = 0; k < (n-1); k++) {
        j = n - k - 2;
        if (std::fabs(v[j]) > 1.0) {
            ccos = 1 / v[j];
            ssin = std::sqrt(1.0 - ccos*ccos);
        } else {
            ssin = v[j];
            ccos = std::sqrt(1.0 - ssin*ssin);
        }
        for (i = 0; i < m; i++) {
            temp = ccos * a[i + j*lda] - ssin*a[i + (n-1)*lda];
            a[i + (n-1)*lda] = ssin*a[i + j*lda] + ccos*a[i + (n-1)*lda];
            a[i + j*lda] = temp;
        }
    }
    for (j = 0; j < (n-1); j++) {
        if (std::fabs(w[j]) > 1.) {
            ccos = 1 / w[j];
            ssin = std::sqrt(1 - ccos*ccos);
        } else {
            ssin = w[j];
            ccos = std::sqrt(1 - ssin*ssin);
        }
        for (i = 0; i < m; i++) {
            temp = ccos*a[i + lda*j] + ssin*a[i + (n-1)*lda];
            a[i + (n-1)*lda] = -ssin*a[i + j*lda] + ccos*a[i + (n-1)*lda];
            a[i + lda*j] = temp;
        }
    }
    return;
}

// ---------------------------------------------------------------- hybrj, resumable
// The solver's state lives in two flat buffers that the JAX loop carries: `f` (doubles)
// and `k` (int32), laid out by HybrjLayout. Each call runs hybrj up to its next call of
// the user's function and says which it needs in k[kRequest]: kWantFun (the residual at
// the trial point, handed to HybrjAfterFun) or kWantJac (the Jacobian at x, handed to
// HybrjAfterJac); kDone when k[kInfo] holds hybrj's info.
enum IntSlot : int { kIter, kNcsuc, kNcfail, kNslow1, kNslow2, kJeval, kNfev, kNjev, kInfo,
                     kRequest, kMaxfev, kMode, kIntSlots };
enum Request : int { kDone = 0, kWantFun = 1, kWantJac = 2 };
enum Scalar : int { kFnorm, kDelta, kXnorm, kPnorm, kXtol, kFactor, kScalars };

struct HybrjLayout {
  int64_t n;
  // offsets into the double buffer: x, fvec, the trial point x + p, the step p, qtf,
  // diag, fjac (column-major, as MINPACK keeps it: SciPy's `fjac` read row by row), r
  // (packed row by row), then the Scalar slots
  int64_t x() const { return 0; }
  int64_t fvec() const { return n; }
  int64_t trial() const { return 2 * n; }
  int64_t step() const { return 3 * n; }
  int64_t qtf() const { return 4 * n; }
  int64_t diag() const { return 5 * n; }
  int64_t fjac() const { return 6 * n; }
  int64_t r() const { return 6 * n + n * n; }
  int64_t scalars() const { return 6 * n + n * n + n * (n + 1) / 2; }
  int64_t size() const { return scalars() + kScalars; }
};

namespace detail {

// hybrj's inner loop head: the dogleg step from x, the trial point x + p, its scaled
// norm (and on the first iteration the step bound's cut to it); then wants fun there.
inline void Trial(const HybrjLayout& L, double* f, int32_t* k) {
  const int n = static_cast<int>(L.n);
  double* s = f + L.scalars();
  double* p = f + L.step();
  double* trial = f + L.trial();
  const double* x = f + L.x();
  const double* diag = f + L.diag();
  std::vector<double> wa2(n), wa3(n);
  dogleg(n, f + L.r(), diag, f + L.qtf(), &s[kDelta], p, wa2.data(), wa3.data());
  for (int j = 0; j < n; j++) {
    p[j] = -p[j];
    trial[j] = x[j] + p[j];
    wa3[j] = diag[j] * p[j];
  }
  s[kPnorm] = enorm(n, wa3.data());
  if (k[kIter] == 1) { s[kDelta] = std::fmin(s[kDelta], s[kPnorm]); }
  k[kRequest] = kWantFun;
}

// The rank-one update of the factors after a step (hybrj's loops 270-280 and the
// calls of r1updt and r1mpyq); `wa3` holds R p + qtf, `wa4` the residual at the trial.
inline void Update(const HybrjLayout& L, double* f, const double* wa4, double* wa3,
                   bool success) {
  const int n = static_cast<int>(L.n);
  const double pnorm = f[L.scalars() + kPnorm];
  double* fjac = f + L.fjac();
  double* qtf = f + L.qtf();
  const double* diag = f + L.diag();
  std::vector<double> wa1(f + L.step(), f + L.step() + n), wa2(n);
  int sing = 0;
  for (int j = 0; j < n; j++) {
    double ssum = 0.0;
    for (int i = 0; i < n; i++) { ssum += fjac[i + n * j] * wa4[i]; }
    wa2[j] = (ssum - wa3[j]) / pnorm;
    wa1[j] = diag[j] * ((diag[j] * wa1[j]) / pnorm);
    if (success) { qtf[j] = ssum; }
  }
  r1updt(n, n, f + L.r(), wa1.data(), wa2.data(), wa3, &sing);
  r1mpyq(n, n, fjac, n, wa2.data(), wa3);
  r1mpyq(1, n, qtf, 1, wa2.data(), wa3);
}

}  // namespace detail

// The Jacobian `jac` (row-major: jac[i * n + j] = d fun_i / d x_j) at x: hybrj's outer
// loop head (QR factors, scaling, Q^T fvec), then its inner loop head.
inline void HybrjAfterJac(const HybrjLayout& L, const double* jac, double* f, int32_t* k) {
  const int n = static_cast<int>(L.n);
  double* fjac = f + L.fjac();
  double* r = f + L.r();
  double* qtf = f + L.qtf();
  double* diag = f + L.diag();
  const double* x = f + L.x();
  const double* fvec = f + L.fvec();
  double* s = f + L.scalars();
  for (int i = 0; i < n; i++) {
    for (int j = 0; j < n; j++) { fjac[i + n * j] = jac[i * n + j]; }
  }
  k[kJeval] = 1;
  k[kNjev] += 1;
  std::vector<double> wa1(n), wa2(n), wa3(n);
  int iwa[1];
  qrfac(n, n, fjac, n, 0, iwa, wa1.data(), wa2.data(), wa3.data());
  if (k[kIter] == 1) {
    if (k[kMode] != 2) {
      for (int j = 0; j < n; j++) { diag[j] = wa2[j] == 0.0 ? 1.0 : wa2[j]; }
    }
    for (int j = 0; j < n; j++) { wa3[j] = diag[j] * x[j]; }
    s[kXnorm] = enorm(n, wa3.data());
    s[kDelta] = s[kFactor] * s[kXnorm];
    s[kDelta] = s[kDelta] == 0.0 ? s[kFactor] : s[kDelta];
  }
  for (int i = 0; i < n; i++) { qtf[i] = fvec[i]; }
  for (int j = 0; j < n; j++) {
    if (fjac[j + n * j] != 0.0) {
      double ssum = 0.0;
      for (int i = j; i < n; i++) { ssum += fjac[i + n * j] * qtf[i]; }
      const double temp = -ssum / fjac[j + n * j];
      for (int i = j; i < n; i++) { qtf[i] += fjac[i + n * j] * temp; }
    }
  }
  for (int j = 0; j < n; j++) {
    int l = j;
    for (int i = 0; i < j; i++) {
      r[l] = fjac[i + n * j];
      l += n - i - 1;
    }
    r[l] = wa1[j];
  }
  qform(n, n, fjac, n, wa1.data());
  if (k[kMode] != 2) {
    for (int j = 0; j < n; j++) { diag[j] = std::fmax(diag[j], wa2[j]); }
  }
  detail::Trial(L, f, k);
}

// The residual `wa4` at the trial point (at x0 on the first call): hybrj's step
// acceptance, step bound, progress counters and tests, and the rank-one update; then
// the next request.
inline void HybrjAfterFun(const HybrjLayout& L, const double* wa4, double* f, int32_t* k) {
  const int n = static_cast<int>(L.n);
  double* s = f + L.scalars();
  double* x = f + L.x();
  double* fvec = f + L.fvec();
  const double* trial = f + L.trial();
  const double* p = f + L.step();
  const double* diag = f + L.diag();
  const double* r = f + L.r();
  const double* qtf = f + L.qtf();
  k[kNfev] += 1;
  if (k[kNfev] == 1) {  // the starting point
    for (int i = 0; i < n; i++) { fvec[i] = wa4[i]; }
    s[kFnorm] = enorm(n, fvec);
    k[kIter] = 1;
    k[kRequest] = kWantJac;
    return;
  }
  const double fnorm1 = enorm(n, wa4);
  const double fnorm = s[kFnorm];
  const double pnorm = s[kPnorm];
  const double actred = fnorm1 < fnorm ? 1.0 - std::pow(fnorm1 / fnorm, 2.0) : -1.0;
  std::vector<double> wa3(n);
  int l = 0;
  for (int i = 0; i < n; i++) {
    double ssum = 0.0;
    for (int j = i; j < n; j++) {
      ssum += r[l] * p[j];
      l++;
    }
    wa3[i] = qtf[i] + ssum;
  }
  double temp = enorm(n, wa3.data());
  const double prered = temp < fnorm ? 1.0 - std::pow(temp / fnorm, 2.0) : 0.0;
  const double ratio = prered > 0.0 ? actred / prered : 0.0;
  double& delta = s[kDelta];
  if (ratio < 0.1) {
    k[kNcsuc] = 0;
    k[kNcfail]++;
    delta = 0.5 * delta;
  } else {
    k[kNcfail] = 0;
    k[kNcsuc]++;
    if ((ratio >= 0.5) || (k[kNcsuc] > 1)) { delta = std::fmax(delta, pnorm / 0.5); }
    if (std::fabs(ratio - 1.0) <= 0.1) { delta = pnorm / 0.5; }
  }
  const bool success = ratio >= 0.0001;
  if (success) {
    std::vector<double> wa2(n);
    for (int j = 0; j < n; j++) {
      x[j] = trial[j];
      wa2[j] = diag[j] * x[j];
      fvec[j] = wa4[j];
    }
    s[kXnorm] = enorm(n, wa2.data());
    s[kFnorm] = fnorm1;
    k[kIter]++;
  }
  k[kNslow1]++;
  if (actred >= 0.001) { k[kNslow1] = 0; }
  if (k[kJeval]) { k[kNslow2]++; }
  if (actred >= 0.1) { k[kNslow2] = 0; }
  int info = 0;
  if ((delta <= s[kXtol] * s[kXnorm]) || (s[kFnorm] == 0.0)) { info = 1; }
  if (info == 0) {
    if (k[kNfev] >= k[kMaxfev]) { info = 2; }
    if (0.1 * std::fmax(0.1 * delta, pnorm) <= kEpsmch * s[kXnorm]) { info = 3; }
    if (k[kNslow2] == 5) { info = 4; }
    if (k[kNslow1] == 10) { info = 5; }
  }
  k[kInfo] = info;
  if (info != 0) {
    k[kRequest] = kDone;
    return;
  }
  if (k[kNcfail] == 2) {  // recompute the Jacobian
    k[kRequest] = kWantJac;
    return;
  }
  detail::Update(L, f, wa4, wa3.data(), success);
  k[kJeval] = 0;
  detail::Trial(L, f, k);
}

}  // namespace jaxbridge::minpack

#endif  // JAXBRIDGE_MATH_MINPACK_HYBRJ_H_
