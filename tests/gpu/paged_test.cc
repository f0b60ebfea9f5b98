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
  for (int64_t width : {1, 7, 128, 513, 2049, 16384}) {  // 2049, 16384: several slabs
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

// Key lists expanded on the device: spans of a decode batch and of prefill chunks (positions
// before the span read the ring through its page table, the span's own rows are local), a
// padding row, a sliding and an HCA layer in one launch, against a host transcription of the
// contract in paged.h. Slots the kernel must leave alone (CSA selections) keep their sentinel.
TEST_F(GpuTest, ExpandKeysFromPageTables) {
  std::mt19937 g(41);
  const int64_t window = 8, width = 16, page_floats = 64, rpp = page_floats / width, cap = 11;
  const int64_t hca_ratio = 4;
  struct Span {
    int64_t first, n, floor;
  };
  // The span at 50 has a window floor at 47 (a resumed MTP block): keys 43-46 stay kKvRefNone.
  const std::vector<Span> spans = {{0, 5, 0}, {30, 1, 0}, {9, 13, 0}, {100, 3, 0}, {50, 4, 47}};
  std::vector<int32_t> row_span;
  std::vector<int64_t> span_pos;
  for (size_t s = 0; s < spans.size(); ++s) {
    span_pos.push_back(spans[s].first);
    span_pos.push_back(static_cast<int64_t>(row_span.size()));
    span_pos.push_back(spans[s].floor);
    for (int64_t t = 0; t < spans[s].n; ++t) row_span.push_back(static_cast<int32_t>(s));
  }
  row_span.push_back(-1);  // a padding row
  const auto rows = static_cast<int64_t>(row_span.size());
  // Per layer: random page tables; 3 reserved slots after each row's keys (like CSA slots).
  auto pages_for = [&](int64_t n_rows, std::vector<int32_t>* pages, std::vector<int32_t>* begin) {
    for (size_t s = 0; s < spans.size(); ++s) {
      begin->push_back(static_cast<int32_t>(pages->size()));
      for (int64_t i = 0; i < (n_rows + rpp - 1) / rpp; ++i)
        pages->push_back(static_cast<int32_t>(g() % 1000));
    }
  };
  std::vector<int32_t> ring_pages[2], ring_begin[2], hca_pages, hca_begin;
  pages_for(cap, &ring_pages[0], &ring_begin[0]);
  pages_for(cap, &ring_pages[1], &ring_begin[1]);
  pages_for(103 / hca_ratio + 1, &hca_pages, &hca_begin);
  std::vector<int64_t> key_begin[2], want[2];
  for (int l = 0; l < 2; ++l) {
    key_begin[l].push_back(0);
    for (int64_t r = 0; r < rows; ++r) {
      const int32_t s = row_span[r];
      if (s >= 0) {
        const int64_t first = spans[s].first;
        const int64_t row0 = span_pos[kExpandKeysSpanWidth * s + 1];
        const int64_t p0 = first + r - row0;
        for (int64_t p = std::max<int64_t>(0, p0 - window + 1); p <= p0; ++p) {
          if (p < first && p < spans[s].floor) {
            want[l].push_back(kKvRefNone);
          } else if (p < first) {
            const int64_t row = p % cap;
            want[l].push_back(static_cast<int64_t>(ring_pages[l][ring_begin[l][s] + row / rpp]) *
                                  page_floats +
                              (row % rpp) * width);
          } else {
            want[l].push_back(-2 - (row0 + p - first) * width);
          }
        }
        if (l == 1) {
          for (int64_t b = 0; b < (p0 + 1) / hca_ratio; ++b)
            want[l].push_back(static_cast<int64_t>(hca_pages[hca_begin[s] + b / rpp]) *
                                  page_floats +
                              (b % rpp) * width);
        }
      }
      for (int i = 0; i < 3; ++i) want[l].push_back(-77);
      key_begin[l].push_back(static_cast<int64_t>(want[l].size()));
    }
  }
  DevVec<int32_t> d_row_span(row_span), d_hca_pages(hca_pages), d_hca_begin(hca_begin);
  DevVec<int64_t> d_span_pos(span_pos);
  DevVec<int32_t> d_ring_pages0(ring_pages[0]), d_ring_pages1(ring_pages[1]);
  DevVec<int32_t> d_ring_begin0(ring_begin[0]), d_ring_begin1(ring_begin[1]);
  DevVec<int64_t> d_begin0(key_begin[0]), d_begin1(key_begin[1]);
  DevVec<int64_t> d_out0(want[0].size() + 1, -77), d_out1(want[1].size() + 1, -77);
  ExpandKeysParams p;
  p.rows = rows;
  p.row_span = d_row_span.get();
  p.span_pos = d_span_pos.get();
  p.window = window;
  p.width = width;
  p.page_floats = page_floats;
  p.n_layers = 2;
  p.layers[0] = ExpandKeysLayer{.out = d_out0.get(),
                                .key_begin = d_begin0.get(),
                                .ring_pages = d_ring_pages0.get(),
                                .ring_page_begin = d_ring_begin0.get(),
                                .ring_capacity = static_cast<int32_t>(cap),
                                .ring_rows_per_page = static_cast<int32_t>(rpp),
                                .entry_rows_per_page = static_cast<int32_t>(rpp)};
  p.layers[1] = ExpandKeysLayer{.out = d_out1.get(),
                                .key_begin = d_begin1.get(),
                                .ring_pages = d_ring_pages1.get(),
                                .ring_page_begin = d_ring_begin1.get(),
                                .hca_pages = d_hca_pages.get(),
                                .hca_page_begin = d_hca_begin.get(),
                                .hca_ratio = static_cast<int32_t>(hca_ratio),
                                .ring_capacity = static_cast<int32_t>(cap),
                                .ring_rows_per_page = static_cast<int32_t>(rpp),
                                .entry_rows_per_page = static_cast<int32_t>(rpp)};
  DSI_EXPECT_OK(launch_expand_keys(p, nullptr));
  sync();
  std::vector<int64_t> got0 = d_out0.download(), got1 = d_out1.download();
  EXPECT_EQ(got0.back(), -77) << "write past the end";
  EXPECT_EQ(got1.back(), -77) << "write past the end";
  got0.pop_back();
  got1.pop_back();
  EXPECT_EQ(got0, want[0]);
  EXPECT_EQ(got1, want[1]);
  // Argument checks.
  p.n_layers = kExpandKeysMaxLayers + 1;
  EXPECT_EQ(launch_expand_keys(p, nullptr).code(), StatusCode::kInvalidArgument);
  p.n_layers = 2;
  p.layers[1].hca_pages = nullptr;
  EXPECT_EQ(launch_expand_keys(p, nullptr).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dsinfer::cuda::test
