// Paged-state addressing ops (kernels/cuda/paged.h) against a host transcription: scatter of rows
// to key references (pool, local, none; strided source), gather (zero rows for none), and key
// references from per-query top-k indices through page tables. All exact (pure data movement).
#include "kernels/cuda/paged.h"

#include <algorithm>
#include <random>
#include <vector>

#include "kernels/cuda/attention.h"
#include "test_util.h"

namespace dsinfer::cuda::test {
namespace {

TEST_F(GpuTest, ScatterAndGatherRowsByReference) {
  std::mt19937 g(3);
  for (int64_t width : {1, 7, 128, 513}) {
    for (int64_t n : {0, 1, 5, 70}) {
      const int64_t ld = width + 3;
      const int64_t slots = 2 * n + 4;
      std::vector<float> src = normal_floats(static_cast<size_t>(std::max<int64_t>(n, 1) * ld), 9);
      // Distinct destination slots, a third in the local buffer, some skipped.
      std::vector<int64_t> perm(static_cast<size_t>(slots));
      for (int64_t i = 0; i < slots; ++i) perm[i] = i;
      std::shuffle(perm.begin(), perm.end(), g);
      std::vector<int64_t> refs(static_cast<size_t>(std::max<int64_t>(n, 1)), kKvRefNone);
      for (int64_t t = 0; t < n; ++t) {
        const int64_t slot = perm[t];
        if (t % 5 == 4)
          continue;
        refs[t] = t % 3 == 0 ? kv_ref_local(slot * width) : kv_ref_pool(slot * width);
      }
      DevVec<float> dsrc(src), pool(static_cast<size_t>(slots * width + 8), -7.0f),
          local(static_cast<size_t>(slots * width + 8), -7.0f);
      DevVec<int64_t> drefs(refs);
      ScatterRowsParams sp{.src = dsrc.get(),
                           .n = n,
                           .width = width,
                           .ld_src = ld,
                           .pool = pool.get(),
                           .local = local.get(),
                           .dest_refs = drefs.get()};
      ASSERT_TRUE(launch_scatter_rows(sp, nullptr).ok());
      sync();
      std::vector<float> want_pool(pool.size(), -7.0f), want_local(local.size(), -7.0f);
      for (int64_t t = 0; t < n; ++t) {
        if (refs[t] == kKvRefNone)
          continue;
        auto& dst = refs[t] >= 0 ? want_pool : want_local;
        const int64_t off = refs[t] >= 0 ? refs[t] : -2 - refs[t];
        for (int64_t c = 0; c < width; ++c) dst[off + c] = src[t * ld + c];
      }
      EXPECT_EQ(pool.download(), want_pool) << width << " " << n;
      EXPECT_EQ(local.download(), want_local) << width << " " << n;
      // Gather them back: equal rows, zeros for skipped ones.
      DevVec<float> out(static_cast<size_t>(std::max<int64_t>(n, 1) * width + 8), 5.0f);
      GatherRowsParams gp{.pool = pool.get(),
                          .local = local.get(),
                          .src_refs = drefs.get(),
                          .n = n,
                          .width = width,
                          .dst = out.get()};
      ASSERT_TRUE(launch_gather_rows(gp, nullptr).ok());
      sync();
      const auto got = out.download();
      for (int64_t t = 0; t < n; ++t) {
        for (int64_t c = 0; c < width; ++c) {
          const float want = refs[t] == kKvRefNone ? 0.0f : src[t * ld + c];
          ASSERT_EQ(got[t * width + c], want) << t << " " << c;
        }
      }
      for (size_t i = static_cast<size_t>(n * width); i < got.size(); ++i)
        ASSERT_EQ(got[i], 5.0f) << "write past the end";
    }
  }
}

TEST_F(GpuTest, RefsFromTopKIndicesThroughPageTables) {
  std::mt19937 g(4);
  const int64_t page_floats = 1024;
  for (int64_t width : {64, 128, 512}) {
    const int64_t rpp = page_floats / width;
    for (int64_t nq : {1, 3, 33}) {
      const int64_t k = 7;
      std::vector<int32_t> pages;
      std::vector<int64_t> page_begin, out_begin, visible;
      std::vector<int32_t> idx;
      int64_t out_size = 0;
      for (int64_t q = 0; q < nq; ++q) {
        const int64_t vis = static_cast<int64_t>(g() % 40);
        page_begin.push_back(static_cast<int64_t>(pages.size()));
        for (int64_t p = 0; p < (vis + rpp - 1) / rpp; ++p)
          pages.push_back(static_cast<int32_t>(g() % 1000));
        visible.push_back(vis);
        out_size += 3;  // a gap: other keys of the query's list
        out_begin.push_back(out_size);
        out_size += k;
        for (int64_t j = 0; j < k; ++j)
          idx.push_back(j < vis ? static_cast<int32_t>(g() % vis) : -1);
      }
      if (pages.empty())
        pages.push_back(0);
      DevVec<int32_t> dpages(pages), didx(idx);
      DevVec<int64_t> dpb(page_begin), dob(out_begin), dout(static_cast<size_t>(out_size), 42);
      RefsFromIndicesParams p{.indices = didx.get(),
                              .nq = nq,
                              .k = k,
                              .pages = dpages.get(),
                              .page_begin = dpb.get(),
                              .rows_per_page = rpp,
                              .page_floats = page_floats,
                              .width = width,
                              .out_begin = dob.get(),
                              .out = dout.get()};
      ASSERT_TRUE(launch_refs_from_indices(p, nullptr).ok());
      sync();
      std::vector<int64_t> want(static_cast<size_t>(out_size), 42);
      for (int64_t q = 0; q < nq; ++q) {
        for (int64_t j = 0; j < k; ++j) {
          const int32_t i = idx[q * k + j];
          want[out_begin[q] + j] =
              i < 0 ? kKvRefNone
                    : paged_row_offset(pages.data() + page_begin[q], rpp, page_floats, width, i);
        }
      }
      EXPECT_EQ(dout.download(), want) << width << " " << nq;
    }
  }
  // Argument checks happen before any launch.
  RefsFromIndicesParams bad{.nq = 1, .k = 1, .rows_per_page = 0};
  EXPECT_FALSE(launch_refs_from_indices(bad, nullptr).ok());
  ScatterRowsParams bad2{.n = 1, .width = 4, .ld_src = 2};
  EXPECT_FALSE(launch_scatter_rows(bad2, nullptr).ok());
}

}  // namespace
}  // namespace dsinfer::cuda::test
