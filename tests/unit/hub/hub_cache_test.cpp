// The Hugging Face cache layout (src/hub/hf_cache.h): where the cache is, repository folder names and
// ids, and revision lookup through refs, full and short commit ids, with the places looked at named.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "base/error.h"
#include "hub/hf_cache.h"
#include "test_tmp.h"

namespace fs = std::filesystem;
using m3::hub::CacheRepo;

namespace {

// Sets an environment variable for one scope and restores what was there.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = getenv(name)) old_ = old;
    value ? setenv(name, value, 1) : unsetenv(name);
  }
  ~ScopedEnv() { old_ ? setenv(name_, old_->c_str(), 1) : unsetenv(name_); }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

const std::string kA = "0123456789abcdef0123456789abcdef01234567";
const std::string kB = "0123456fffffffffffffffffffffffffffffffff";

// A cache with two snapshots of ORG/NAME (commits kA and kB, sharing the prefix 0123456), refs/main -> kA.
fs::path make_cache(const std::string& name) {
  const fs::path cache = fs::path(m3test::test_tmp_dir()) / name;
  fs::remove_all(cache);
  CacheRepo repo(cache, "ORG/NAME");
  fs::create_directories(repo.snapshot_dir(kA));
  fs::create_directories(repo.snapshot_dir(kB));
  repo.write_ref("main", kA);
  return cache;
}

}  // namespace

TEST(HubCache, CacheDirFollowsHuggingfaceHubEnvironment) {
  ScopedEnv a("HF_HUB_CACHE", nullptr), b("HUGGINGFACE_HUB_CACHE", nullptr), c("HF_HOME", nullptr),
      d("XDG_CACHE_HOME", nullptr), e("HOME", "/home/u");
  EXPECT_EQ(m3::hub::default_cache_dir(), fs::path("/home/u/.cache/huggingface/hub"));
  {
    ScopedEnv x("XDG_CACHE_HOME", "/xdg");
    EXPECT_EQ(m3::hub::default_cache_dir(), fs::path("/xdg/huggingface/hub"));
    ScopedEnv h("HF_HOME", "/hf");
    EXPECT_EQ(m3::hub::default_cache_dir(), fs::path("/hf/hub"));
    ScopedEnv l("HUGGINGFACE_HUB_CACHE", "/legacy");
    EXPECT_EQ(m3::hub::default_cache_dir(), fs::path("/legacy"));
    ScopedEnv n("HF_HUB_CACHE", "/hubcache");
    EXPECT_EQ(m3::hub::default_cache_dir(), fs::path("/hubcache"));
  }
}

TEST(HubCache, EnvFlagReadsTrueValuesAsHuggingfaceHub) {
  for (const char* v : {"1", "on", "YES", "True"}) {
    ScopedEnv e("M3_TEST_FLAG", v);
    EXPECT_TRUE(m3::hub::env_flag("M3_TEST_FLAG")) << v;
  }
  for (const char* v : {"0", "off", "", "no"}) {
    ScopedEnv e("M3_TEST_FLAG", v);
    EXPECT_FALSE(m3::hub::env_flag("M3_TEST_FLAG")) << v;
  }
}

TEST(HubCache, RepoIdsAndFolderNames) {
  EXPECT_EQ(m3::hub::repo_folder_name("MiniMaxAI/MiniMax-M3.1-Flash"), "models--MiniMaxAI--MiniMax-M3.1-Flash");
  EXPECT_EQ(m3::hub::repo_folder_name("gpt2"), "models--gpt2");
  for (const char* ok : {"MiniMaxAI/MiniMax-M3.1-Flash", "gpt2", "a_b/c.d"}) EXPECT_TRUE(m3::hub::is_repo_id(ok)) << ok;
  for (const char* bad : {"", "a/b/c", "a--b/c", "a/..b", "-a/b", "a/b.", "a b/c", "/abs/path"})
    EXPECT_FALSE(m3::hub::is_repo_id(bad)) << bad;
  EXPECT_TRUE(m3::hub::is_commit_sha(kA));
  EXPECT_FALSE(m3::hub::is_commit_sha("main"));
  EXPECT_FALSE(m3::hub::is_commit_sha(kA.substr(0, 39)));
}

TEST(HubCache, RevisionByBranchFullCommitAndUniquePrefix) {
  const CacheRepo repo(make_cache("revs"), "ORG/NAME");
  EXPECT_EQ(repo.find_commit("main", nullptr), kA);
  EXPECT_EQ(repo.find_commit(kB, nullptr), kB);
  EXPECT_EQ(repo.find_commit("0123456789", nullptr), kA);  // unique prefix
  EXPECT_EQ(repo.find_commit("0123456f", nullptr), kB);
  repo.write_ref("v2", kB);  // a tag
  EXPECT_EQ(repo.find_commit("v2", nullptr), kB);
}

TEST(HubCache, AmbiguousPrefixIsRefusedNamingTheCommits) {
  const CacheRepo repo(make_cache("ambiguous"), "ORG/NAME");
  try {
    repo.find_commit("0123456", nullptr);
    FAIL() << "ambiguous prefix accepted";
  } catch (const m3::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("ambiguous"), std::string::npos) << m;
    EXPECT_NE(m.find(kA), std::string::npos) << m;
    EXPECT_NE(m.find(kB), std::string::npos) << m;
  }
}

TEST(HubCache, MissingRevisionNamesThePlacesLooked) {
  const CacheRepo repo(make_cache("missing"), "ORG/NAME");
  std::vector<std::string> looked;
  EXPECT_EQ(repo.find_commit("dev", &looked), std::nullopt);
  ASSERT_FALSE(looked.empty());
  EXPECT_NE(looked.front().find("refs/dev"), std::string::npos) << looked.front();
  looked.clear();
  const std::string absent = "ffffffffffffffffffffffffffffffffffffffff";
  EXPECT_EQ(repo.find_commit(absent, &looked), std::nullopt);
  ASSERT_EQ(looked.size(), 1u);
  EXPECT_NE(looked.front().find("snapshots/" + absent), std::string::npos) << looked.front();
  // A ref naming a snapshot that is not there (a cache partly deleted).
  repo.write_ref("stale", absent);
  looked.clear();
  EXPECT_EQ(repo.find_commit("stale", &looked), std::nullopt);
  ASSERT_EQ(looked.size(), 1u);
  EXPECT_NE(looked.front().find("names commit " + absent), std::string::npos) << looked.front();
}

TEST(HubCache, SnapshotFilesAreRelativeLinksToBlobs) {
  const CacheRepo repo(make_cache("links"), "ORG/NAME");
  fs::create_directories(repo.blob_path("x").parent_path());
  std::ofstream(repo.blob_path("etag1")) << "hello";
  repo.link(kA, "dspark/config.json", "etag1");
  const fs::path link = repo.snapshot_dir(kA) / "dspark" / "config.json";
  ASSERT_TRUE(fs::is_symlink(link));
  EXPECT_EQ(fs::read_symlink(link), fs::path("../../../blobs/etag1"));
  std::ifstream in(link);
  std::string s;
  in >> s;
  EXPECT_EQ(s, "hello");
  // The ref file holds the bare commit id, as huggingface_hub writes it.
  std::ifstream ref(repo.ref_path("main"));
  std::string text((std::istreambuf_iterator<char>(ref)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, kA);
}
