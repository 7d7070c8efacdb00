#include "common/model_desc.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

v1::ModelSpec Model(int n_layer) {
  v1::ModelSpec m;
  m.set_n_layer(n_layer);
  return m;
}

TEST(ModelDesc, LayerSequence) {
  const v1::ModelSpec m = Model(4);
  EXPECT_EQ(NumLayers(m), 6);
  EXPECT_EQ(LayerName(m, 0), "embedding");
  EXPECT_EQ(LayerName(m, 1), "block_0");
  EXPECT_EQ(LayerName(m, 4), "block_3");
  EXPECT_EQ(LayerName(m, 5), "head");
}

TEST(UniformPartition, SingleStageHoldsEverything) {
  absl::StatusOr<std::vector<LayerRange>> p = UniformPartition(Model(4), 1);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(*p, ElementsAre(LayerRange{0, 6}));
}

TEST(UniformPartition, SixLayersOverTwoStages) {
  absl::StatusOr<std::vector<LayerRange>> p = UniformPartition(Model(4), 2);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(*p, ElementsAre(LayerRange{0, 3}, LayerRange{3, 6}));
}

TEST(UniformPartition, SixLayersOverThreeStages) {
  absl::StatusOr<std::vector<LayerRange>> p = UniformPartition(Model(4), 3);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(*p, ElementsAre(LayerRange{0, 2}, LayerRange{2, 4}, LayerRange{4, 6}));
}

TEST(UniformPartition, EarlierStagesTakeTheRemainder) {
  // 7 layers (embedding, 5 blocks, head) over 3 stages: 3 + 2 + 2.
  absl::StatusOr<std::vector<LayerRange>> p = UniformPartition(Model(5), 3);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(*p, ElementsAre(LayerRange{0, 3}, LayerRange{3, 5}, LayerRange{5, 7}));
}

TEST(UniformPartition, OneLayerPerStage) {
  absl::StatusOr<std::vector<LayerRange>> p = UniformPartition(Model(2), 4);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(*p,
              ElementsAre(LayerRange{0, 1}, LayerRange{1, 2}, LayerRange{2, 3}, LayerRange{3, 4}));
}

TEST(UniformPartition, RangesCoverEveryLayerContiguously) {
  for (int n_layer = 1; n_layer <= 12; ++n_layer) {
    for (int stages = 1; stages <= n_layer + 2; ++stages) {
      absl::StatusOr<std::vector<LayerRange>> p = UniformPartition(Model(n_layer), stages);
      ASSERT_TRUE(p.ok()) << p.status();
      ASSERT_EQ(p->size(), static_cast<size_t>(stages));
      int next = 0;
      for (const LayerRange& r : *p) {
        EXPECT_EQ(r.begin, next);
        EXPECT_GT(r.end, r.begin);
        next = r.end;
      }
      EXPECT_EQ(next, n_layer + 2);
    }
  }
}

TEST(UniformPartition, MoreStagesThanLayers) {
  absl::StatusOr<std::vector<LayerRange>> p = UniformPartition(Model(4), 7);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(p.status().message(), HasSubstr("6 layers"));
  EXPECT_FALSE(UniformPartition(Model(4), 0).ok());
}

}  // namespace
}  // namespace tandem
