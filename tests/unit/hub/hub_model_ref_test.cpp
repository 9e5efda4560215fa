// Model reference resolution without a network (src/hub/model_ref.h): local directories, Hub ids
// found in a cache offline (by branch, commit, prefix), incomplete snapshots, the errors naming the
// id, revision and places looked; the files a download fetches.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "base/error.h"
#include "hub/hf_cache.h"
#include "hub/model_ref.h"
#include "test_tmp.h"

namespace fs = std::filesystem;
using m3::hub::FileSet;

namespace {

const std::string kCommit = "89abcdef0123456789abcdef0123456789abcdef";

// An offline cache holding ORG/NAME at kCommit (refs/main), its files symlinked to blobs.
m3::hub::HubSettings offline_cache(const std::string& name, bool with_shard = true) {
  m3::hub::HubSettings s;
  s.cache_dir = fs::path(m3test::test_tmp_dir()) / name;
  s.offline = true;
  s.endpoint = "http://127.0.0.1:9";  // never contacted offline
  fs::remove_all(s.cache_dir);
  const m3::hub::CacheRepo repo(s.cache_dir, "ORG/NAME");
  fs::create_directories(repo.blob_path("x").parent_path());
  std::ofstream(repo.blob_path("cfg")) << "{}";
  std::ofstream(repo.blob_path("w")) << "";
  repo.link(kCommit, "config.json", "cfg");
  repo.link(kCommit, "tokenizer.json", "cfg");
  if (with_shard) repo.link(kCommit, "model.safetensors", "w");
  repo.write_ref("main", kCommit);
  return s;
}

std::string error_of(const std::string& ref, const std::string& rev, const m3::hub::HubSettings& s) {
  try {
    m3::hub::resolve_model_ref(ref, rev, FileSet::Model, s, "MODEL");
  } catch (const m3::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(HubModelRef, LocalDirectoryIsUsedAsIs) {
  const auto s = offline_cache("local");
  const std::string dir = m3test::test_tmp_dir();
  EXPECT_EQ(m3::hub::resolve_model_ref(dir, "", FileSet::Model, s, "MODEL").dir, dir);
  // A revision cannot apply to a directory: refused, naming both.
  const std::string m = error_of(dir, "v1", s);
  EXPECT_NE(m.find("local directory"), std::string::npos) << m;
  EXPECT_NE(m.find("v1"), std::string::npos) << m;
}

TEST(HubModelRef, OfflineCacheByBranchCommitAndPrefix) {
  const auto s = offline_cache("offline");
  const std::string snap = (s.cache_dir / "models--ORG--NAME" / "snapshots" / kCommit).string();
  EXPECT_EQ(m3::hub::resolve_model_ref("ORG/NAME", "", FileSet::Model, s, "MODEL").dir, snap);
  EXPECT_EQ(m3::hub::resolve_model_ref("ORG/NAME", "main", FileSet::Model, s, "MODEL").dir, snap);
  EXPECT_EQ(m3::hub::resolve_model_ref("ORG/NAME", kCommit, FileSet::Model, s, "MODEL").dir, snap);
  EXPECT_EQ(m3::hub::resolve_model_ref("ORG/NAME", kCommit.substr(0, 8), FileSet::Model, s, "MODEL").dir, snap);
}

TEST(HubModelRef, NotFoundNamesIdRevisionAndEveryPlace) {
  const auto s = offline_cache("notfound");
  const std::string m = error_of("ORG/OTHER", "dev", s);
  EXPECT_NE(m.find("ORG/OTHER"), std::string::npos) << m;
  EXPECT_NE(m.find("revision dev"), std::string::npos) << m;
  EXPECT_NE(m.find("no directory"), std::string::npos) << m;
  EXPECT_NE(m.find((s.cache_dir / "models--ORG--OTHER" / "refs" / "dev").string()), std::string::npos) << m;
  EXPECT_NE(m.find("HF_HUB_OFFLINE"), std::string::npos) << m;
}

TEST(HubModelRef, IncompleteSnapshotIsNotUsed) {
  const auto s = offline_cache("incomplete", /*with_shard=*/false);
  const std::string m = error_of("ORG/NAME", "", s);
  EXPECT_NE(m.find("no *.safetensors file"), std::string::npos) << m;
  // The tokenizer alone is complete.
  EXPECT_NO_THROW(m3::hub::resolve_model_ref("ORG/NAME", "", FileSet::Tokenizer, s, "--tokenizer"));
}

TEST(HubModelRef, PathsThatDoNotExistAreNotLookedUpAsIds) {
  const auto s = offline_cache("paths");
  for (const char* p : {"/no/such/dir", "./nope", "a/b/c"}) {
    const std::string m = error_of(p, "", s);
    EXPECT_NE(m.find("no such directory"), std::string::npos) << p << ": " << m;
  }
}

TEST(HubModelRef, OnlyTheFilesTheEngineReadsAreFetched) {
  for (const char* f : {"model-00001-of-00002.safetensors", "model.safetensors.index.json", "config.json",
                        "generation_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                        "dspark/config.json", "dspark/model.safetensors"})
    EXPECT_TRUE(m3::hub::wanted_file(f, FileSet::Model)) << f;
  for (const char* f : {"README.md", "original/model.safetensors", "pytorch_model.bin", "special_tokens_map.json",
                        ".gitattributes", "figures/a.png"})
    EXPECT_FALSE(m3::hub::wanted_file(f, FileSet::Model)) << f;
  EXPECT_TRUE(m3::hub::wanted_file("tokenizer.json", FileSet::Tokenizer));
  EXPECT_FALSE(m3::hub::wanted_file("config.json", FileSet::Tokenizer));
  EXPECT_FALSE(m3::hub::wanted_file("model.safetensors", FileSet::Tokenizer));
}
